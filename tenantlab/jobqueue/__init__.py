"""A PostgreSQL job queue that counts every attempt, leases it, and fences its finish.

Standalone: it imports only the standard library and psycopg, so it can be vendored into an
application (``tenantlab export-worker DIR``). The pieces:

- ``migrations``: the tables, in a schema of their own (``jobqueue``), by numbered migrations;
- ``handlers`` / ``Handlers``: the application's functions by job kind (a worker claims only
  the kinds it has);
- ``enqueue(conn, kind, tenant=..., payload=..., queue=..., priority=..., unique_key=...)``:
  queue a job in the caller's transaction; ``enqueue_many`` thousands in one statement;
  ``enqueue_async`` / ``enqueue_many_async`` the same on an ``AsyncConnection``;
- ``schedules``: periodic jobs (every N seconds, or a cron expression), once per slot;
- ``Leased``: claim (attempt counted, durable) / execute (fenced start, tenant set locally,
  nothing held while a handler does not write) / fail, fenced;
- ``Heartbeats``: one thread per worker extending every lease it holds (on by default, every
  third of the lease), up to a maximum runtime;
- ``Reaper`` and ``prune``: final states for expired leases (after a grace), history bounded;
- ``Worker`` and ``WorkerOptions``: the loop (LISTEN/NOTIFY, reconnects, clean stop);
- ``ops``: the operator's ``stats``, ``jobs``, ``show``, ``retry``, ``cancel`` (every attempt is
  kept in ``job_runs`` with its outcome and error); ``logs``: text or JSON log lines per job;
- ``enqueue`` / ``enqueue_many`` (one statement) and their ``_async`` variants; ``periodic``:
  jobs enqueued once per slot (an interval or a cron expression);
- ``python -m`` this package: ``worker`` (default), ``reap``, ``prune``, ``migrate``,
  ``enqueue``, and the operator's commands.
"""

from .enqueue import Job, enqueue_async, enqueue_many, enqueue_many_async
from .handlers import Handler, Handlers, handlers
from .heartbeat import Heartbeat, HeartbeatConfig, HeartbeatError, Heartbeats
from .jobs import (
    Claim,
    ConfigError,
    Events,
    JobQueueError,
    LeaseLost,
    NullEvents,
    Outcome,
    Status,
    UnknownKind,
)
from .leased import Leased, Work, broken, enqueue
from .options import WorkerOptions
from .periodic import Cron, Schedule, Schedules, schedules
from .reaper import Reaper, ReaperConfig, prune
from .tenant import TenantContextError, set_tenant_local
from .worker import EXIT_CONFIG, EXIT_CRASHED, EXIT_SERVER_LOST, EXIT_STOPPED, ServerLost, Worker

__all__ = [
    "EXIT_CONFIG", "EXIT_CRASHED", "EXIT_SERVER_LOST", "EXIT_STOPPED",
    "Claim", "ConfigError", "Cron", "Events", "Handler", "Handlers", "Heartbeat",
    "HeartbeatConfig", "HeartbeatError", "Heartbeats", "Job", "JobQueueError", "LeaseLost",
    "Leased", "NullEvents", "Outcome", "Reaper", "ReaperConfig", "Schedule", "Schedules",
    "ServerLost", "Status", "TenantContextError", "UnknownKind", "Work", "Worker",
    "WorkerOptions", "broken", "enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async",
    "handlers", "prune", "schedules", "set_tenant_local",
]
