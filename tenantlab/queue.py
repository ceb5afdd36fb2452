"""Two queue designs behind one interface: ``run_one(conn, work, ...)`` claims, works, finishes.

``SingleTransaction`` is the article's "most used" queue: the row lock is the claim, and claim,
work and finish share one transaction. Simple, and it has two limits the article measured: a
failure rolls back its own attempt count (finding ``poison``; ``handle_errors`` counts it in a
new transaction), and a job that kills the process kills every next worker (finding ``crash``).

``Leased`` commits its claim first (attempt counted, lease set), runs the work as the tenant
in a short transaction of its own, and fences the finish: only the attempt that was claimed
may complete or fail the job. A failed job waits a backoff that grows with its attempts.
Its steps are separate methods (``claim``, ``execute``, ``fail``) so a heartbeat or a maximum
runtime can wrap ``execute`` without touching the rest.

Both take an autocommit connection: every transaction here is an explicit block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import psycopg
from psycopg.rows import class_row, dict_row

from . import db, kinds
from . import heartbeat as hb
from .events import EventLog, NullLog
from .queries import q
from .tenant import set_tenant

log = logging.getLogger("tenantlab")

Work = Callable[[psycopg.Connection, "Claim", EventLog], Any]
Status = Literal["done", "failed", "queued", "dead", "fenced"]


class QueueError(Exception):
    """A queue misused or misconfigured."""


class LeaseLost(QueueError):
    """The job no longer carries this worker's attempt: another attempt owns it now."""


@dataclass
class Claim:
    """One claimed job: what the worker needs to run it, and the attempt it owns."""

    id: int
    tenant_id: int
    attempt: int
    kind: str
    seconds: float
    run_id: int | None = None  # the job_runs row of this execution, once written


@dataclass
class Outcome:
    """What became of one claimed job.

    ``status``: done; failed (error not counted, job still queued); queued (counted, will be
    retried); dead (counted, out of attempts); fenced (another attempt owns the job).
    """

    claim: Claim
    status: Status
    error: str | None = None
    result: Any = None


class Design(Protocol):
    name: str

    def run_one(self, conn: psycopg.Connection, work: Work = ..., *, worker: str = ...,
                events: EventLog | None = None) -> Outcome | None: ...


def start_run(conn: psycopg.Connection, claim: Claim, worker: str, events: EventLog) -> None:
    """Set the tenant (local form) and write the execution's job_runs row, in the open transaction."""
    set_tenant(conn, claim.tenant_id, local=True)
    claim.run_id = db.scalar(
        conn, q("start_run"), {"id": claim.id, "worker": worker, "attempt": claim.attempt})
    events.emit("execute", job=claim.id, attempt=claim.attempt, tenant=claim.tenant_id,
                kind=claim.kind)


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:500]


def _claimed(events: EventLog, claim: Claim) -> None:
    events.emit("claim", job=claim.id, attempt=claim.attempt, tenant=claim.tenant_id,
                kind=claim.kind)


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

    def run_one(self, conn: psycopg.Connection, work: Work = kinds.run, *,
                worker: str = "worker", events: EventLog | None = None) -> Outcome | None:
        """Claim and run the oldest queued job; return None when there is none."""
        events = events or NullLog(worker)
        claim: Claim | None = None
        try:
            with conn.transaction():
                with conn.cursor(row_factory=class_row(Claim)) as cur:
                    claim = cur.execute(q("claim_single")).fetchone()
                if claim is None:
                    return None
                _claimed(events, claim)
                start_run(conn, claim, worker, events)
                result = work(conn, claim, events)
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
        text = _error_text(error)
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


class Leased:
    """Claim in a committed statement (attempt counted, lease set); fence the finish.

    ``lease``: seconds a claim is exclusive; a job still running after it may be claimed again.
    ``backoff``: seconds before the first retry, doubling with each attempt (0 turns it off),
    with jitter and capped at ``backoff_cap``. ``heartbeat``: seconds between lease extensions
    while the work runs (tenantlab/heartbeat.py); ``max_runtime``: seconds after which the
    heartbeat stops and the job is abandoned. ``fence=False`` finishes without the attempt check
    (the naive lease-only queue of finding overrun; never in production). ``durable_claim``:
    wait for the claim's own WAL flush (by default the claim commits with synchronous_commit
    off, and the work's commit makes it durable: one fsync per job instead of two).
    """

    name = "leased"

    def __init__(self, *, lease: float = 30.0, backoff: float = 1.0,
                 backoff_cap: float = 300.0, heartbeat: float | None = None,
                 max_runtime: float | None = None, fence: bool = True,
                 durable_claim: bool = False) -> None:
        if not lease > 0:
            raise QueueError(f"lease must be a positive number of seconds, not {lease!r}")
        if backoff < 0 or backoff_cap < 0:
            raise QueueError(f"backoff must be 0 (off) or positive seconds, not {backoff!r}")
        self.lease, self.backoff, self.backoff_cap = float(lease), float(backoff), backoff_cap
        hb.check(self.lease, heartbeat, max_runtime)
        self.beat = hb.HeartbeatConfig(self.lease, heartbeat, max_runtime) if heartbeat else None
        self.fence = fence
        self.durable_claim = durable_claim

    def __repr__(self) -> str:
        extra = f", heartbeat={self.beat.interval:g}, max_runtime={self.beat.max_runtime}" \
            if self.beat else ""
        return (f"Leased(lease={self.lease:g}, backoff={self.backoff:g}{extra}"
                f"{'' if self.fence else ', fence=False'})")

    def claim(self, conn: psycopg.Connection) -> Claim | None:
        """Take the oldest eligible job and commit the claim before any work starts."""
        # Its own transaction: once committed, a worker crash can no longer undo the count.
        with conn.transaction(), conn.cursor(row_factory=class_row(Claim)) as cur:
            if not self.durable_claim:
                # Skip the claim's own WAL flush (a second fsync per job): the work's commit
                # flushes it anyway, and other sessions see it at once. Only a crash of the
                # server itself before that flush can lose it, and then the work is lost too; a
                # job that crashes the server within the flush delay (wal_writer_delay, 200 ms by
                # default) would go uncounted. durable_claim=True closes that, at one more fsync.
                cur.execute(q("claim_commit_async"))
            return cur.execute(q("claim_leased"), {"lease": self.lease}).fetchone()

    def execute(self, conn: psycopg.Connection, claim: Claim, work: Work = kinds.run, *,
                worker: str = "worker", events: EventLog | None = None) -> Outcome:
        """Run the work as the tenant and complete the job if this attempt still owns it.

        The work's errors propagate (``run_one`` hands them to ``fail``). When the fence says
        another attempt owns the job, everything this execution wrote rolls back.
        """
        events = events or NullLog(worker)
        try:
            with conn.transaction():
                start_run(conn, claim, worker, events)
                # The heartbeat covers the work only: it stops before the finish, so a beat can
                # never run into this attempt's own completion and report it as a lost lease.
                with self._heartbeat(conn, claim, worker, events):
                    result = work(conn, claim, events)
                finish = "complete_if_owner" if self.fence else "complete_unfenced"
                finished = db.scalar(conn, q(finish), {
                    "id": claim.id, "attempt": claim.attempt, "run": claim.run_id,
                })
                if not finished:
                    raise LeaseLost(f"job {claim.id} lease lost at attempt {claim.attempt}")
        except LeaseLost as e:
            events.emit("fenced", job=claim.id, attempt=claim.attempt, step="complete")
            return Outcome(claim, "fenced", error=str(e))
        events.emit("finish", job=claim.id, attempt=claim.attempt, result=result)
        return Outcome(claim, "done", result=result)

    def _heartbeat(self, conn: psycopg.Connection, claim: Claim, worker: str,
                   events: EventLog) -> AbstractContextManager[object]:
        if self.beat is None:
            return nullcontext()
        return hb.Heartbeat(hb.dsn_of(conn), claim, self.beat, worker=worker, events=events)

    def fail(self, conn: psycopg.Connection, claim: Claim, error: BaseException, *,
             events: EventLog | None = None) -> Outcome:
        """Record a failed attempt if it still owns the job: queued after a backoff, or dead."""
        events = events or NullLog()
        text = _error_text(error)
        with conn.transaction():
            row = conn.execute(q("fail_if_owner"), {
                "id": claim.id, "attempt": claim.attempt, "error": text,
                "backoff": self.backoff, "backoff_cap": self.backoff_cap,
            }).fetchone()
        if row is None:
            events.emit("fenced", job=claim.id, attempt=claim.attempt, step="fail", error=text)
            return Outcome(claim, "fenced", error=text)
        status, _attempts, run_after = row
        events.emit("fail", job=claim.id, attempt=claim.attempt, error=text, counted=True,
                    run_after=run_after)
        if status == "dead":
            events.emit("dead", job=claim.id, attempt=claim.attempt)
        return Outcome(claim, status, error=text)

    def run_one(self, conn: psycopg.Connection, work: Work = kinds.run, *,
                worker: str = "worker", events: EventLog | None = None) -> Outcome | None:
        """Claim, execute, and on error fail the oldest eligible job; None when there is none."""
        events = events or NullLog(worker)
        claim = self.claim(conn)
        if claim is None:
            return None
        _claimed(events, claim)
        try:
            return self.execute(conn, claim, work, worker=worker, events=events)
        except Exception as e:
            return self.fail(conn, claim, e, events=events)


def design(name: str, *, lease: float = 30.0, backoff: float = 1.0,
           handle_errors: bool = False, heartbeat: float | None = None,
           max_runtime: float | None = None, fence: bool = True) -> SingleTransaction | Leased:
    """Return the design called `name` ('single' or 'leased') with its options."""
    if name == "single":
        if heartbeat is not None or max_runtime is not None or not fence:
            raise QueueError("heartbeat, max-runtime and no-fence need the leased design: "
                             "the single-transaction design has no lease")
        return SingleTransaction(handle_errors=handle_errors)
    if name == "leased":
        return Leased(lease=lease, backoff=backoff, heartbeat=heartbeat,
                      max_runtime=max_runtime, fence=fence)
    raise QueueError(f"unknown design {name!r}; valid: single, leased")


def enqueue(conn: psycopg.Connection, kind: str, *, tenant: int | None = None, count: int = 1,
            seconds: float = 0.0, max_attempts: int = 3) -> list[int]:
    """Queue `count` jobs of one kind (tenant None: spread over tenants 1..100); return ids."""
    if kind not in kinds.KINDS:
        raise QueueError(f"unknown job kind {kind!r}; valid: {', '.join(kinds.KINDS)}")
    with conn.transaction():
        rows = conn.execute(q("enqueue"), {
            "tenant": tenant, "kind": kind, "seconds": seconds, "count": count,
            "max_attempts": max_attempts,
        }).fetchall()
    return [r[0] for r in rows]


def job_states(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Return every job's state (status, attempts, lease, runs) as dicts, by id."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(q("job_states")).fetchall()
