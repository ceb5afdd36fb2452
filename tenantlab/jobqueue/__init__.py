"""A PostgreSQL job queue that counts every attempt, leases it, and fences its finish.

Standalone: it imports only the standard library and psycopg, so it can be vendored into an
application (``tenantlab export-worker DIR``). The pieces:

- ``handlers`` / ``Handlers``: the application's functions by job kind;
- ``enqueue(conn, kind, tenant=..., payload=...)``: queue a job in the caller's transaction;
- ``Leased``: claim (attempt counted, durable) / execute (tenant set locally) / fail, fenced;
- ``Heartbeats``: one thread per worker extending every lease it holds, up to a maximum runtime;
- ``Reaper`` and ``prune``: final states for expired leases, and history kept bounded;
- ``Worker`` and ``WorkerOptions``: the loop (LISTEN/NOTIFY, reconnects, clean stop);
- ``python -m`` this package: ``worker`` (default), ``reap``, ``prune``, ``schema``.
"""

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
from .leased import Leased, Work, enqueue
from .options import WorkerOptions
from .reaper import Reaper, ReaperConfig, prune
from .tenant import TenantContextError, set_tenant_local
from .worker import EXIT_CONFIG, EXIT_CRASHED, EXIT_SERVER_LOST, EXIT_STOPPED, ServerLost, Worker

__all__ = [
    "EXIT_CONFIG", "EXIT_CRASHED", "EXIT_SERVER_LOST", "EXIT_STOPPED",
    "Claim", "ConfigError", "Events", "Handler", "Handlers", "Heartbeat", "HeartbeatConfig",
    "HeartbeatError", "Heartbeats", "JobQueueError", "LeaseLost", "Leased", "NullEvents",
    "Outcome", "Reaper", "ReaperConfig", "ServerLost", "Status", "TenantContextError",
    "UnknownKind", "Work", "Worker", "WorkerOptions", "enqueue", "handlers", "prune",
    "set_tenant_local",
]
