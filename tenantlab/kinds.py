"""Run one job's work by its kind: count, sleep, fail, crash, noop, outside (tenantlab/outside.py).

Each kind runs inside the work's transaction, with the tenant already set locally and the
``job_runs`` row already written. Add a kind by adding a function to ``KINDS``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from .outside import call as outside
from .queries import q
from .tenant import count_invoices

if TYPE_CHECKING:
    from .events import EventLog
    from .queue import Claim

Kind = Callable[[psycopg.Connection, "Claim", "EventLog"], Any]


class UnknownKind(ValueError):
    """A job whose kind no worker knows: it fails like any other error."""


def count(conn: psycopg.Connection, claim: Claim, events: EventLog) -> int:
    """Count the invoices the tenant context can see (row-level security decides)."""
    return count_invoices(conn)


def sleep(conn: psycopg.Connection, claim: Claim, events: EventLog) -> None:
    """Hold the transaction open for the job's seconds, as slow work would."""
    time.sleep(claim.seconds)


def fail(conn: psycopg.Connection, claim: Claim, events: EventLog) -> None:
    """Raise division_by_zero from the server, every time: the poison pill."""
    conn.execute(q("poison"))


def crash(conn: psycopg.Connection, claim: Claim, events: EventLog) -> None:
    """End the worker process mid-work, skipping every handler (as an OOM kill would)."""
    time.sleep(claim.seconds)
    # The line goes out before the process ends: experiments see the crash coming.
    events.emit("crash", job=claim.id, attempt=claim.attempt, tenant=claim.tenant_id)
    os._exit(1)


def noop(conn: psycopg.Connection, claim: Claim, events: EventLog) -> None:
    """Do nothing: what the benchmark measures is the queue itself."""


KINDS: dict[str, Kind] = {"count": count, "sleep": sleep, "fail": fail, "crash": crash,
                          "noop": noop, "outside": outside}


def run(conn: psycopg.Connection, claim: Claim, events: EventLog) -> Any:
    """Run the claimed job's kind."""
    try:
        kind = KINDS[claim.kind]
    except KeyError:
        raise UnknownKind(f"job {claim.id} has unknown kind {claim.kind!r}; "
                          f"known: {', '.join(KINDS)}") from None
    return kind(conn, claim, events)
