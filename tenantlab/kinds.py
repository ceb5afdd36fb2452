"""The demo job kinds, registered as handlers of the production worker: ``kinds.handlers``.

count, sleep, fail, crash, noop, outside and outside_once (tenantlab/outside.py). Each runs
inside the work's transaction, with the tenant already set locally; ``sleep`` and ``outside``
write a row first when their payload says ``"write": true`` (a handler that writes holds a
transaction id until its finish commits; one that does not holds none);
``job.events`` is the worker's event log. Add a kind with ``@handlers.register("name")``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from jobqueue import Claim, Handlers, UnknownKind

from .outside import call as outside
from .outside import call_once as outside_once
from .queries import q
from .tenant import count_invoices

__all__ = ["KINDS", "UnknownKind", "count", "crash", "fail", "handlers", "noop", "outside",
           "outside_once", "run", "seconds"]

handlers = Handlers()


def write_first(conn: psycopg.Connection, job: Claim) -> None:
    """Write one row first when the payload asks (``"write": true``): a handler that writes."""
    if job.payload.get("write"):
        conn.execute(q("demo_write"), {"id": job.id, "attempt": job.attempt,
                                       "tenant": job.tenant_id})


def seconds(job: Claim) -> float:
    """Return how long a demo job works: its payload's ``seconds`` (0 when absent)."""
    return float(job.payload.get("seconds") or 0)


@handlers.register("count")
def count(conn: psycopg.Connection, job: Claim) -> int:
    """Count the invoices the tenant context can see (row-level security decides)."""
    return count_invoices(conn)


@handlers.register("sleep")
def sleep(conn: psycopg.Connection, job: Claim) -> None:
    """Hold the transaction open for the job's seconds, as slow work would."""
    write_first(conn, job)
    time.sleep(seconds(job))


@handlers.register("fail")
def fail(conn: psycopg.Connection, job: Claim) -> None:
    """Raise division_by_zero from the server, every time: the poison pill."""
    conn.execute(q("poison"))


@handlers.register("crash")
def crash(conn: psycopg.Connection, job: Claim) -> None:
    """End the worker process mid-work, skipping every handler (as an OOM kill would)."""
    time.sleep(seconds(job))
    # The line goes out before the process ends: experiments see the crash coming.
    job.events.emit("crash", job=job.id, attempt=job.attempt, tenant=job.tenant_id)
    os._exit(1)


@handlers.register("noop")
def noop(conn: psycopg.Connection, job: Claim) -> None:
    """Do nothing: what the benchmark measures is the queue itself."""


@handlers.register("outside")
def outside_call(conn: psycopg.Connection, job: Claim) -> None:
    """Call the outside world after the job's seconds (tenantlab/outside.py)."""
    write_first(conn, job)
    outside(conn, job)



handlers.add("outside_once", outside_once)

#: The kinds by name (a read-only view of ``handlers``).
KINDS = handlers


def run(conn: psycopg.Connection, job: Claim) -> Any:
    """Run the claimed job's kind."""
    return handlers.run(conn, job)
