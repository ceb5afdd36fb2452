"""Two queue designs behind one interface: ``run_one(conn, work, ...)`` claims, works, finishes.

``SingleTransaction`` is the article's "most used" queue: the row lock is the claim, and claim,
work and finish share one transaction. Simple, and it has two limits the article measured: a
failure rolls back its own attempt count (finding ``poison``; ``handle_errors`` counts it in a
new transaction), and a job that kills the process kills every next worker (finding ``crash``).

``Leased`` is the production worker (``jobqueue.Leased``) with the lab's demo kinds
as its handlers and one lab-only switch, ``fence=False``: the naive lease-only queue of finding
``overrun``. Its steps are separate methods (``claim``, ``execute``, ``fail``).

Work is ``work(conn, claim)``; ``claim.events`` is the worker's event log. Both designs take an
autocommit connection: every transaction here is an explicit block.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import jobqueue as production
import psycopg
from jobqueue import Claim, LeaseLost, Outcome, Status, Work, error_text
from jobqueue import JobQueueError as QueueError
from psycopg.rows import class_row, dict_row

from . import kinds
from .events import EventLog, NullLog
from .queries import q

log = logging.getLogger("tenantlab")

__all__ = ["Claim", "Design", "LeaseLost", "Leased", "Outcome", "QueueError", "SingleTransaction",
           "Status", "Work", "check_heartbeat", "design", "enqueue", "job_states"]


class Design(Protocol):
    name: str

    def run_one(self, conn: psycopg.Connection, work: Work | None = ..., *, worker: str = ...,
                events: EventLog | None = None) -> Outcome | None: ...


class SingleTransaction:
    """Claim with ``FOR UPDATE SKIP LOCKED``, set the tenant, work, finish: one commit.

    Without ``handle_errors`` a failing job goes back to the head of the queue uncounted.
    With it, a new transaction counts the attempt and marks the job dead at max_attempts; the
    retry still follows at once, and a crash still skips the handler.
    """

    name = "single"

    def __init__(self, *, handle_errors: bool = False) -> None:
        self.handle_errors = handle_errors

    def __repr__(self) -> str:
        return f"SingleTransaction(handle_errors={self.handle_errors})"

    def run_one(self, conn: psycopg.Connection, work: Work | None = None, *,
                worker: str = "worker", events: EventLog | None = None) -> Outcome | None:
        """Claim and run the oldest queued job; return None when there is none."""
        events = events or NullLog(worker)
        work = work or kinds.run
        claim: Claim | None = None
        try:
            with conn.transaction():
                with conn.cursor(row_factory=class_row(Claim)) as cur:
                    claim = cur.execute(q("claim_single")).fetchone()
                if claim is None:
                    return None
                claim.worker, claim.events = worker, events
                events.emit("claim", job=claim.id, attempt=claim.attempt, tenant=claim.tenant_id,
                            kind=claim.kind)
                row = conn.execute(q("start_run_single"), {
                    "id": claim.id, "worker": worker, "attempt": claim.attempt,
                    "tenant": str(claim.tenant_id)}).fetchone()
                claim.run_id = row[0] if row else None
                events.emit("execute", job=claim.id, attempt=claim.attempt,
                            tenant=claim.tenant_id, kind=claim.kind)
                result = work(conn, claim)
                conn.execute(q("finish_single"), {"id": claim.id, "run": claim.run_id})
        except Exception as e:
            if claim is None:
                raise
            return self._failed(conn, claim, e, events)
        events.emit("finish", job=claim.id, attempt=claim.attempt, result=result)
        return Outcome(claim, "done", result=result)

    def _failed(self, conn: psycopg.Connection, claim: Claim, error: Exception,
                events: EventLog) -> Outcome:
        # The rollback took the attempt count and the job_runs row with it.
        text = error_text(error)
        if not self.handle_errors:
            events.emit("fail", job=claim.id, attempt=claim.attempt, error=text, counted=False)
            return Outcome(claim, "failed", error=text)
        with conn.transaction():
            row = conn.execute(q("fail_single"), {"id": claim.id, "error": text}).fetchone()
        status: Status = row[0] if row else "failed"
        attempts = row[1] if row else None
        events.emit("fail", job=claim.id, attempt=attempts, error=text, counted=row is not None)
        if status == "dead":
            events.emit("dead", job=claim.id, attempt=attempts)
        return Outcome(claim, status, error=text)


class Leased(production.Leased):
    """The production worker with the demo kinds; ``fence=False`` is the lab's naive finish.

    ``durable_claim=False`` is the lab's name for the production ``lossy_claim=True``. Unlike
    the production worker, the lab's has no heartbeat unless given one: the findings show what
    happens without it. It changes the production design only through its public statements
    (``start_query``, ``finish_query``).
    """

    def __init__(self, *, lease: float = 30.0, backoff: float = 1.0,
                 backoff_cap: float = 300.0, heartbeat: float | None = None,
                 max_runtime: float | None = None, fence: bool = True,
                 durable_claim: bool = True, handlers: Any = None, fair: Any = None) -> None:
        super().__init__(handlers if handlers is not None else kinds.handlers, lease=lease,
                         backoff=backoff, backoff_cap=backoff_cap, heartbeat=heartbeat,
                         max_runtime=max_runtime, lossy_claim=not durable_claim, fair=fair)
        self.fence = fence
        self.durable_claim = durable_claim
        # The naive finish claims nothing with it: the next claim is a statement of its own.
        self.chain_claims = fence

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + ("" if self.fence else ", fence=False") + ")"

    def start_query(self, claim: Claim) -> tuple[str, dict[str, Any]]:
        if self.fence:
            return super().start_query(claim)
        # The naive lease-only queue trusts its lease: it starts whatever it claimed.
        return q("start_unfenced"), {"tenant": str(claim.tenant_id)}

    def finish_query(self, claim: Claim) -> tuple[str, dict[str, Any]]:
        if self.fence:
            return super().finish_query(claim)
        return q("complete_unfenced"), {"id": claim.id, "attempt": claim.attempt,
                                        "worker": claim.worker, "started": claim.started}


def check_heartbeat(lease: float, interval: float | None, max_runtime: float | None) -> None:
    """Refuse a heartbeat the production worker would refuse (``HeartbeatError``, saying why)."""
    if interval is not None or max_runtime is not None:
        production.HeartbeatConfig(lease, interval, max_runtime)  # type: ignore[arg-type]


def design(name: str, *, lease: float = 30.0, backoff: float = 1.0,
           handle_errors: bool = False, heartbeat: float | None = None,
           max_runtime: float | None = None, fence: bool = True,
           fair: str | None = None, durable_claim: bool = True) -> SingleTransaction | Leased:
    """Return the design called `name` ('single' or 'leased') with its options."""
    if name == "single":
        if heartbeat or max_runtime is not None or not fence or fair or not durable_claim:
            raise QueueError("heartbeat, max-runtime, no-fence and fair need the leased design: "
                             "the single-transaction design has no lease")
        return SingleTransaction(handle_errors=handle_errors)
    if name == "leased":
        return Leased(lease=lease, backoff=backoff, heartbeat=heartbeat or None,
                      max_runtime=max_runtime, fence=fence, fair=fair,
                      durable_claim=durable_claim)
    raise QueueError(f"unknown design {name!r}; valid: single, leased")


def enqueue(conn: psycopg.Connection, kind: str, *, tenant: int | None = None, count: int = 1,
            seconds: float = 0.0, max_attempts: int = 3, write: bool = False) -> list[int]:
    """Queue `count` demo jobs of one kind (tenant None: spread over tenants 1..100); return ids.

    ``write``: the job writes a row (``job_writes``) before its work, as a handler that writes
    to the database does: it then holds a transaction id until its finish commits.

    For any other kind, with a payload: ``jobqueue.enqueue``.
    """
    if kind not in kinds.handlers:
        raise QueueError(f"unknown job kind {kind!r}; valid: {', '.join(kinds.handlers)}")
    with conn.transaction():
        rows = conn.execute(q("enqueue_demo"), {
            "tenant": tenant, "kind": kind, "seconds": seconds, "count": count,
            "max_attempts": max_attempts, "write": write,
        }).fetchall()
    return [r[0] for r in rows]


def job_states(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Return every job's state (status, attempts, lease, runs) as dicts, by id."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(q("job_states")).fetchall()
