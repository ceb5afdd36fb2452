"""A PostgreSQL job queue that counts every attempt, leases it, and fences its finish.

It imports only the standard library and psycopg. ``__all__`` below is the whole public
surface: the names, and the public modules (``cli``, ``migrations``, ``ops``, ``options``,
``queries``) with their own ``__all__``. Anything else may change in any release. The pieces:

- ``migrations``: the tables, in a schema of their own (``jobqueue``), by numbered migrations;
- ``handlers`` / ``Handlers``: the application's functions by job kind (a worker claims only
  the kinds it has);
- ``enqueue(conn, kind, tenant=..., payload=..., queue=..., priority=..., unique_key=...)``:
  queue a job in the caller's transaction; ``enqueue_many`` thousands in one statement;
  ``enqueue_async`` / ``enqueue_many_async`` the same on an ``AsyncConnection``;
- ``schedules``: periodic jobs (every N seconds, or a cron expression), once per slot;
- ``Leased``: claim (attempt counted, durable) / execute (fenced start, tenant set locally,
  nothing held while a handler does not write) / fail, fenced; its ``claim_query``,
  ``start_query``, ``finish_query`` are extension points for a subclass;
- ``Hooks``: the application's code before each job's start, after its finish, on its failure;
- ``Heartbeats``: one thread per worker extending every lease it holds (on by default, every
  third of the lease), up to a maximum runtime;
- ``Reaper`` and ``prune``: final states for expired leases (after a grace), history bounded;
- ``Worker`` and ``WorkerOptions``: the loop (LISTEN/NOTIFY, reconnects, clean stop);
  ``options``: the flags made from an options dataclass (a subclass may add its own);
- ``ops``: the operator's ``stats``, ``jobs``, ``show``, ``retry``, ``cancel`` (every attempt is
  kept in ``job_runs`` with its outcome and error); ``cli``: the command line, and the pieces
  another command line may embed;
- ``queries``: the named SQL statements (``q(name)``), readable in ``sql/queries.sql``;
- ``jobqueue`` (or ``python -m jobqueue``): ``worker`` (default), ``reap``, ``prune``,
  ``migrate``, ``enqueue``, and the operator's commands.
"""

from . import cli, migrations, ops, options, queries
from .enqueue import Job, enqueue_async, enqueue_many, enqueue_many_async
from .handlers import Handler, Handlers, handlers
from .heartbeat import Heartbeat, HeartbeatConfig, HeartbeatError, Heartbeats
from .hooks import Hooks
from .jobs import (
    MAX_SECONDS,
    Claim,
    ConfigError,
    Events,
    JobQueueError,
    LeaseLost,
    NullEvents,
    Outcome,
    Status,
    UnknownKind,
    error_text,
)
from .leased import Leased, Work, broken, enqueue
from .options import WorkerOptions
from .periodic import Cron, Schedule, Schedules, schedules
from .preflight import check_dsn, diagnose, refused_login
from .reaper import Reaper, ReaperConfig, prune
from .tenant import DEFAULT_TENANT_SETTING, TenantContextError, set_tenant_local
from .worker import (
    EXIT_CONFIG,
    EXIT_CRASHED,
    EXIT_SERVER_LOST,
    EXIT_STOPPED,
    ServerLost,
    Worker,
    stop_on_signals,
)

__all__ = [
    "DEFAULT_TENANT_SETTING", "EXIT_CONFIG", "EXIT_CRASHED", "EXIT_SERVER_LOST", "EXIT_STOPPED",
    "MAX_SECONDS",
    "Claim", "ConfigError", "Cron", "Events", "Handler", "Handlers", "Heartbeat",
    "HeartbeatConfig", "HeartbeatError", "Heartbeats", "Hooks", "Job", "JobQueueError",
    "LeaseLost", "Leased", "NullEvents", "Outcome", "Reaper", "ReaperConfig", "Schedule",
    "Schedules", "ServerLost", "Status", "TenantContextError", "UnknownKind", "Work", "Worker",
    "WorkerOptions", "broken", "check_dsn", "cli", "diagnose", "enqueue", "enqueue_async",
    "enqueue_many", "enqueue_many_async", "error_text", "handlers", "migrations", "ops",
    "options", "prune", "queries", "refused_login", "schedules", "set_tenant_local",
    "stop_on_signals",
]
