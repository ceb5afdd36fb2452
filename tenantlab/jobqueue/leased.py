"""Claim, execute and fail jobs: the attempt counted at the claim, the finish fenced.

The claim is a statement of its own, committed durably before any work starts: the attempt
is counted and the lease set, and no crash can undo that. The work runs in a transaction of
its own with the tenant set locally; the finish is **fenced**: only the attempt that was
claimed may complete or fail the job, so a worker that outlived its lease cannot overwrite
what the next attempt did (everything it wrote rolls back). A failed job waits a backoff that
grows with its attempts; at ``max_attempts`` it is dead.

Round trips per job: the claim (1, committed on its own), then the work's transaction:
BEGIN, the tenant and the ``job_runs`` row in one statement, the handler's own statements, the
fenced finish, COMMIT. A worker that goes on claims its next job in the finish's statement
(``claim_next``): one durable commit per job, four round trips.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from .fair import Fair
from .fair import fair as as_fair
from .handlers import Handler, Handlers
from .handlers import handlers as default_handlers
from .heartbeat import HeartbeatConfig, Heartbeats, check, dsn_of
from .jobs import (
    Claim,
    ConfigError,
    Events,
    LeaseLost,
    NullEvents,
    Outcome,
    Status,
    error_text,
)
from .queries import q

APP = (__package__ or "jobqueue").split(".")[0]
log = logging.getLogger(APP)

Work = Callable[[psycopg.Connection, Claim], Any]


class Leased:
    """Claim in a committed statement (attempt counted, lease set); fence the finish.

    ``handlers``: the kinds this worker runs (default: the package's ``handlers`` registry).
    ``lease``: seconds a claim is exclusive; a job still running after it may be claimed again.
    ``backoff``: seconds before the first retry, doubling with each attempt (0 turns it off),
    with jitter and capped at ``backoff_cap``. ``heartbeat``: seconds between lease extensions
    while a job is held (one thread and connection for all of them); ``max_runtime``: seconds
    after which the heartbeat lets a job go (abandoned). ``lossy_claim``: commit the claim
    without waiting for its WAL flush: faster, but a server crash right after a claim can lose
    its count, and the same attempt number is then handed out twice (off by default).
    """

    name = "leased"

    def __init__(self, handlers: Handlers | dict[str, Handler] | None = None, *,
                 lease: float = 30.0, backoff: float = 1.0, backoff_cap: float = 300.0,
                 heartbeat: float | None = None, max_runtime: float | None = None,
                 lossy_claim: bool = False, fair: Fair | str | None = None) -> None:
        if not lease > 0:
            raise ConfigError(f"lease must be a positive number of seconds, not {lease!r}")
        if backoff < 0 or backoff_cap < 0:
            raise ConfigError(f"backoff must be 0 (off) or positive seconds, not {backoff!r}")
        check(float(lease), heartbeat, max_runtime)
        if handlers is None:
            handlers = default_handlers
        self.handlers = handlers if isinstance(handlers, Handlers) else Handlers(handlers)
        self.lease, self.backoff, self.backoff_cap = float(lease), float(backoff), backoff_cap
        self.beat = HeartbeatConfig(self.lease, heartbeat, max_runtime) if heartbeat else None
        self.lossy_claim = lossy_claim
        #: A fair claim policy (fair.py) instead of the oldest job first; None = FIFO.
        self.fair = as_fair(fair)
        if self.fair and lossy_claim:
            raise ConfigError("lossy-claim has no fair variant: use one or the other")
        self._heartbeats: Heartbeats | None = None

    def __repr__(self) -> str:
        extra = f", heartbeat={self.beat.interval:g}, max_runtime={self.beat.max_runtime}" \
            if self.beat else ""
        extra += f", fair={str(self.fair)!r}" if self.fair else ""
        return f"Leased(lease={self.lease:g}, backoff={self.backoff:g}{extra})"

    # -- claim ---------------------------------------------------------------------------------

    def claim_many(self, conn: psycopg.Connection, n: int = 1, *, worker: str = "worker",
                   events: Events | None = None) -> list[Claim]:
        """Claim up to `n` eligible jobs, oldest first (or as ``fair`` picks), each leased."""
        events = events or NullEvents(worker)
        query, params = self._claim_query(n)
        # Its own transaction (autocommit: one statement), committed before any work starts.
        with _autocommit(conn), conn.cursor(row_factory=class_row(Claim)) as cur:
            claims = cur.execute(query, params).fetchall()
        claims.sort(key=lambda c: c.id)
        self._claimed(conn, claims, worker, events)
        return claims

    def _claim_query(self, n: int) -> tuple[str, dict[str, Any]]:
        """Return this worker's claim statement (FIFO, lossy or fair) and its parameters."""
        params: dict[str, Any] = {"lease": self.lease, "batch": n}
        if self.fair:
            return q(self.fair.query), params | self.fair.params
        return q("claim_leased_lossy" if self.lossy_claim else "claim_leased"), params

    def claim(self, conn: psycopg.Connection, *, worker: str = "worker",
              events: Events | None = None) -> Claim | None:
        """Claim the oldest eligible job; None when there is none."""
        claims = self.claim_many(conn, 1, worker=worker, events=events)
        return claims[0] if claims else None

    def heartbeats(self, conn: psycopg.Connection) -> Heartbeats:
        """Return this design's heartbeat (one per worker), started on first use."""
        if self.beat is None:
            raise ConfigError("this design has no heartbeat: pass heartbeat=SECONDS")
        if self._heartbeats is None:
            self._heartbeats = Heartbeats(dsn_of(conn), self.beat, name=_name(conn))
        return self._heartbeats

    # -- execute -------------------------------------------------------------------------------

    def execute(self, conn: psycopg.Connection, claim: Claim, work: Work | None = None, *,
                worker: str | None = None, events: Events | None = None,
                claim_next: int | Callable[[], int] = 0) -> Outcome:
        """Run the job's handler as its tenant, and complete it if this attempt still owns it.

        The handler's errors propagate (``run_one`` hands them to ``fail``). When the fence says
        another attempt owns the job, everything this execution wrote rolls back.
        ``claim_next``: also claim up to that many jobs in the finish's commit (one durable
        commit per job, not two); they are in the outcome's ``claimed``, counted and leased. A
        callable is asked at the finish (a worker told to stop meanwhile claims nothing).
        """
        if worker is not None:
            claim.worker = worker
        if events is not None:
            claim.events = events
        ev = claim.events
        try:
            try:
                with _work_transaction(conn):
                    self._start(conn, claim)
                    fn = work or self.handlers.lookup(claim)
                    result = fn(conn, claim)
                    # The heartbeat covers the work only: released before the finish, a beat
                    # can never run into this attempt's own completion and call it lost.
                    self.release(claim)
                    more = claim_next() if callable(claim_next) else claim_next
                    finished, claimed = self._complete(conn, claim, more)
                    if not finished:
                        raise LeaseLost(f"job {claim.id} lease lost at attempt {claim.attempt}")
            finally:
                self.release(claim)
        except LeaseLost as e:
            ev.emit("fenced", job=claim.id, attempt=claim.attempt, step="complete")
            return Outcome(claim, "fenced", error=str(e))
        ev.emit("finish", job=claim.id, attempt=claim.attempt, result=result)
        # Committed: the next jobs are this worker's now.
        self._claimed(conn, claimed, claim.worker, ev)
        return Outcome(claim, "done", result=result, claimed=claimed)

    def _start(self, conn: psycopg.Connection, claim: Claim) -> None:
        """Set the tenant (local form) and write the execution's job_runs row, in one statement."""
        self._started(claim, conn.execute(q("start_run"), _start_params(claim)).fetchone())

    def _started(self, claim: Claim, row: Any) -> None:
        claim.run_id = row[0] if row else None
        claim.events.emit("execute", job=claim.id, attempt=claim.attempt,
                          tenant=claim.tenant_id, kind=claim.kind)

    def _finish(self, claim: Claim) -> tuple[str, dict[str, Any]]:
        """The statement that finishes a job: fenced, only the claimed attempt may finish."""
        return q("complete_if_owner"), {"id": claim.id, "attempt": claim.attempt,
                                        "run": claim.run_id}

    def _complete(self, conn: psycopg.Connection, claim: Claim,
                  claim_next: int = 0) -> tuple[bool, list[Claim]]:
        """Finish the job if this attempt still owns it (False = fenced out); claim the next."""
        if not claim_next or self.fair:
            row = conn.execute(*self._finish(claim)).fetchone()
            if not (row and row[0]) or not claim_next:
                return bool(row and row[0]), []
            # A fair claim has no finish-and-claim statement: its own statement, in the same
            # transaction as the fenced finish (one commit for both, as with FIFO).
            with conn.cursor(row_factory=class_row(Claim)) as cur:
                claims = cur.execute(*self._claim_query(claim_next)).fetchall()
            return True, sorted(claims, key=lambda c: c.id)
        rows = conn.execute(q("complete_if_owner_and_claim"), {
            "id": claim.id, "attempt": claim.attempt, "run": claim.run_id,
            "lease": self.lease, "batch": claim_next}).fetchall()
        claims = sorted((Claim(id=r[1], tenant_id=r[2], attempt=r[3], kind=r[4], payload=r[5])
                         for r in rows if r[1] is not None), key=lambda c: c.id)
        return bool(rows and rows[0][0]), claims

    def _claimed(self, conn: psycopg.Connection, claims: list[Claim], worker: str,
                 events: Events) -> None:
        for c in claims:
            c.worker, c.events = worker, events
            events.emit("claim", job=c.id, attempt=c.attempt, tenant=c.tenant_id, kind=c.kind)
            if self.beat is not None:
                # From the claim: a batch's later jobs keep their leases while they wait.
                self.heartbeats(conn).hold(c)

    def release(self, claim: Claim) -> None:
        """Stop extending the claim's lease (its work ended, or will never start)."""
        if self._heartbeats is not None:
            self._heartbeats.release(claim)

    # -- fail ----------------------------------------------------------------------------------

    def fail(self, conn: psycopg.Connection, claim: Claim, error: BaseException, *,
             events: Events | None = None) -> Outcome:
        """Record a failed attempt if it still owns the job: queued after a backoff, or dead."""
        self.release(claim)
        ev = events or claim.events
        text = error_text(error)
        with _autocommit(conn):
            row = conn.execute(q("fail_if_owner"), {
                "id": claim.id, "attempt": claim.attempt, "error": text,
                "backoff": self.backoff, "backoff_cap": self.backoff_cap,
            }).fetchone()
        if row is None:
            ev.emit("fenced", job=claim.id, attempt=claim.attempt, step="fail", error=text)
            return Outcome(claim, "fenced", error=text)
        status, _attempts, run_after = row
        log.info("job %s attempt %s failed (%s): %s", claim.id, claim.attempt, status, text)
        ev.emit("fail", job=claim.id, attempt=claim.attempt, error=text, counted=True,
                run_after=run_after)
        if status == "dead":
            ev.emit("dead", job=claim.id, attempt=claim.attempt)
        return Outcome(claim, status, error=text)

    # -- all three -----------------------------------------------------------------------------

    def run_claimed(self, conn: psycopg.Connection, claim: Claim, work: Work | None = None, *,
                    claim_next: int | Callable[[], int] = 0) -> Outcome:
        """Execute one claimed job; on error, fail it (counted, fenced)."""
        try:
            return self.execute(conn, claim, work, claim_next=claim_next)
        except Exception as e:
            # A lost connection fails here too and propagates: the lease expires, and the
            # job is retried, counted (the worker reconnects).
            return self.fail(conn, claim, e)

    def run_one(self, conn: psycopg.Connection, work: Work | None = None, *,
                worker: str = "worker", events: Events | None = None) -> Outcome | None:
        """Claim, execute, and on error fail the oldest eligible job; None when there is none."""
        claim = self.claim(conn, worker=worker, events=events)
        if claim is None:
            return None
        return self.run_claimed(conn, claim, work)

    def run_together(self, conn: psycopg.Connection, claims: list[Claim], *,
                     claim_next: int | Callable[[], int] = 0) -> list[Outcome]:
        """Run claimed jobs one after another in one transaction, one commit for them all.

        Each job runs in a savepoint of its own: its tenant set locally, its finish fenced on
        its own (a fenced or failing job rolls back to its savepoint, and a failure is counted
        in the same transaction). One fsync for the batch instead of one per job; the price: a
        crash before that commit loses every finish of the batch (their attempts were counted
        at the claim: they run again, counted), and the batch's last job must end within the
        first one's lease (use a heartbeat for long batches).
        """
        results: list[tuple[Claim, Outcome]] = []
        claimed: list[Claim] = []
        with _work_transaction(conn):
            started = -1  # the last job whose savepoint and start were sent
            for i, c in enumerate(claims):
                # Savepoint j<i> is never released: a fenced or failing job rolls back to it.
                # Pipelined, a done job costs one round trip: its fenced finish travels with
                # the next job's savepoint and start (a fenced finish rolls those back too,
                # and the next job starts again).
                try:
                    try:
                        if started < i:
                            with conn.pipeline():
                                conn.execute(f"savepoint j{i}")
                                cur = conn.execute(q("start_run"), _start_params(c))
                            self._started(c, cur.fetchone())
                            started = i
                        result = self.handlers.lookup(c)(conn, c)
                        self.release(c)
                        nxt = claims[i + 1] if i + 1 < len(claims) else None
                        with conn.pipeline():
                            done = conn.execute(*self._finish(c))
                            if nxt is not None:
                                conn.execute(f"savepoint j{i + 1}")
                                cur = conn.execute(q("start_run"), _start_params(nxt))
                        if not (row := done.fetchone()) or not row[0]:
                            raise LeaseLost(f"job {c.id} lease lost at attempt {c.attempt}")
                        if nxt is not None:
                            self._started(nxt, cur.fetchone())
                            started = i + 1
                    except (psycopg.OperationalError, psycopg.InterfaceError):
                        raise  # the connection is gone: the worker reconnects
                    except BaseException:
                        if not conn.closed:
                            conn.execute(f"rollback to savepoint j{i}")
                        raise
                    results.append((c, Outcome(c, "done", result=result)))
                except LeaseLost as e:
                    results.append((c, Outcome(c, "fenced", error=str(e))))
                except (psycopg.OperationalError, psycopg.InterfaceError):
                    raise
                except Exception as e:
                    self.release(c)
                    text = error_text(e)
                    row = conn.execute(q("fail_if_owner"), {
                        "id": c.id, "attempt": c.attempt, "error": text,
                        "backoff": self.backoff, "backoff_cap": self.backoff_cap,
                    }).fetchone()
                    status: Status = row[0] if row else "fenced"
                    results.append((c, Outcome(c, status, error=text)))
            more = claim_next() if callable(claim_next) else claim_next
            if more:
                with conn.cursor(row_factory=class_row(Claim)) as claim_cur:
                    # The worker's own claim (FIFO, lossy or fair), as every other claim.
                    claimed = sorted(claim_cur.execute(*self._claim_query(more)).fetchall(),
                                     key=lambda c: c.id)
        # Committed: now it happened, and the events say so.
        for c, o in results:
            ev = c.events
            if o.status == "done":
                ev.emit("finish", job=c.id, attempt=c.attempt, result=o.result)
            elif o.status == "fenced":
                ev.emit("fenced", job=c.id, attempt=c.attempt, step="complete")
            else:
                ev.emit("fail", job=c.id, attempt=c.attempt, error=o.error, counted=True)
                if o.status == "dead":
                    ev.emit("dead", job=c.id, attempt=c.attempt)
        if claims:
            self._claimed(conn, claimed, claims[-1].worker, claims[-1].events)
            results[-1][1].claimed = claimed
        return [o for _, o in results]

    def close(self) -> None:
        """Stop the heartbeat's thread and close its connection."""
        if self._heartbeats is not None:
            self._heartbeats.close()


def enqueue(conn: psycopg.Connection, kind: str, *, tenant: int, payload: Any = None,
            max_attempts: int = 3, run_after: Any = None) -> int:
    """Queue one job of any kind for `tenant`; return its id. Runs in the caller's transaction.

    The kind is not checked here: a worker without a handler for it fails the job (counted)
    with an error that names the kinds it knows. ``payload``: anything JSON can hold.
    """
    if isinstance(tenant, bool) or not isinstance(tenant, int):
        raise ConfigError(f"tenant must be an int, not {tenant!r}")
    if max_attempts < 1:
        raise ConfigError(f"max_attempts must be at least 1, not {max_attempts}")
    json.dumps(payload)  # refuse what cannot be stored, here rather than in the worker
    row = conn.execute(q("enqueue"), {
        "tenant": tenant, "kind": kind, "payload": Jsonb(payload if payload is not None else {}),
        "max_attempts": max_attempts, "run_after": run_after,
    }).fetchone()
    assert row is not None
    return int(row[0])


def _start_params(claim: Claim) -> dict[str, Any]:
    return {"id": claim.id, "worker": claim.worker, "attempt": claim.attempt,
            "tenant": str(claim.tenant_id)}


def _name(conn: psycopg.Connection) -> str:
    return str(conn.info.parameter_status("application_name") or APP).removeprefix(f"{APP} ")


@contextmanager
def _autocommit(conn: psycopg.Connection) -> Iterator[None]:
    """Run the block's statements each as its own committed transaction."""
    if conn.autocommit:
        yield
        return
    with conn.transaction():
        yield


@contextmanager
def _work_transaction(conn: psycopg.Connection) -> Iterator[None]:
    with conn.transaction():
        yield
