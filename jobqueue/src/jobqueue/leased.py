"""Claim, execute and fail jobs: the attempt counted at the claim, the finish fenced.

The claim is a statement of its own, committed durably before any work starts: the attempt
is counted and the lease set, and no crash can undo that. The work runs in a transaction of
its own with the tenant set locally; the finish is **fenced**: only the attempt that was
claimed may complete or fail the job, so a worker that outlived its lease cannot overwrite
what the next attempt did (everything it wrote rolls back). A failed job waits a backoff that
grows with its attempts; at ``max_attempts`` it is dead.

The start holds nothing: it is one read that sets the tenant locally and checks that this
attempt still owns the job with its lease running (a claim whose lease ran out before its work
began is not started). The execution's ``job_runs`` row is written by the fenced finish (a
failed attempt's by the fenced fail, a fenced one's after its rollback). So a
handler that does not write holds no transaction id while it runs and VACUUM is free; a handler
that writes holds one from its first write until the finish commits (that is the price of its
writes committing atomically with the finish).

Errors are told apart by the connection's state, not by the exception's class: a statement
timeout, a lock timeout, a deadlock or a serialization failure fails its job alone (counted,
recorded); only a broken connection is an outage, which the worker survives by reconnecting.

Round trips per job: the claim (1, committed on its own), then the work's transaction: BEGIN,
the fenced start, the handler's own statements, the fenced finish, COMMIT. A worker that goes on
sends the claim of its next jobs with the finish, in one pipeline and one commit
(``claim_next``): one durable commit per job, four round trips.

Extension points (public: a subclass may override them): ``claim_query``, ``start_query``,
``finish_query`` return the statement and parameters of each step; ``chain_claims`` (False:
always claim on its own). ``hooks`` (hooks.py) run the application's code around each job.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, NoReturn

import psycopg
from psycopg.generators import execute
from psycopg.rows import class_row

from . import logs
from .enqueue import DEFAULT_QUEUE, parse_queues
from .enqueue import enqueue as enqueue
from .fair import Fair
from .fair import fair as as_fair
from .handlers import Handler, Handlers
from .handlers import handlers as default_handlers
from .heartbeat import (
    AUTO,
    HeartbeatConfig,
    Heartbeats,
    Presence,
    check,
    dsn_of,
    interval_for,
    runtime_for,
)
from .hooks import NO_HOOKS, Hooks, after_finish, on_failure
from .jobs import (
    Claim,
    ConfigError,
    Events,
    JobQueueError,
    LeaseLost,
    NullEvents,
    Outcome,
    error_detail,
)
from .preflight import pooler_error
from .queries import q
from .tenant import DEFAULT_TENANT_SETTING, check_setting

APP = (__package__ or "jobqueue").split(".")[0]
log = logging.getLogger(APP)

Work = Callable[[psycopg.Connection, Claim], Any]
INERROR = psycopg.pq.TransactionStatus.INERROR
#: How long the watchdog's fail waits for a job's row lock (held briefly by a beat or a cancel,
#: or for a whole batch by --batch-commit, which then fails the job itself).
OVERDUE_LOCK_TIMEOUT_MS = 1000


def _limit_written(query: str, n: int) -> str:
    """Return the claim with its batch size written in (a number, not a parameter).

    PostgreSQL costs a generic plan's ``limit $n`` as if it fetched a tenth of the rows: once
    the queue held 100,000 jobs and the table was analyzed (a bulk, or autoanalyze), the kept
    generic plan looked dearer than a fresh one and every claim was planned afresh (205 plans
    in 200 claims, 1.08 to 1.45x the claim's time before; with the number, 23 plans, 0.98 to
    1.08x). One prepared statement per batch size: a worker asks for one or two sizes.
    """
    return query.replace("%(batch)s", str(int(n)))


class Leased:
    """Claim in a committed statement (attempt counted, lease set); fence the start and finish.

    ``handlers``: the kinds this worker runs (default: the package's ``handlers`` registry); it
    claims only jobs of those kinds. ``lease``: seconds a claim is exclusive unless extended.
    ``heartbeat``: seconds between lease extensions while a job is held (one thread and
    connection for all of them); ``"auto"`` (the default) is a third of the lease, None turns it
    off (then a job longer than its lease is claimed again while it runs). ``max_runtime``:
    seconds after which the heartbeat lets a job go and fails the attempt (the watchdog;
    ``"auto"``, the default, is an hour with a heartbeat; None turns it off). ``backoff``: seconds before
    the first retry, doubling with each attempt (0 turns it off), with jitter and capped at
    ``backoff_cap``. ``lossy_claim``: commit a claim made on its own without waiting for its WAL
    flush (a claim sent with a finish commits with it, durably): faster, but a server crash
    right after a claim can lose its count, and the same attempt number is then handed out
    twice (off by default). ``fair``: a fair claim policy (fair.py) instead of the oldest first.
    ``chain_claims``: claim the next jobs in the finish's commit (False: always on their own).
    ``queues``: the queues this worker serves (default: ``'default'`` only); across them the
    highest priority first, then the oldest claimable. ``tenant_setting``: the setting the
    job's tenant is set to, locally (default ``app.tenant``: what the row-level security
    policies read; a bound value, never formatted into SQL). ``hooks``: code around each job
    (hooks.py).
    """

    name = "leased"
    chain_claims = True
    #: Called in a finish's transaction when the claim that went with it found nothing (the
    #: worker goes idle at that commit): the worker registers itself as idle there (worker.py).
    on_idle: Callable[[psycopg.Connection], None] | None = None

    def __init__(self, handlers: Handlers | dict[str, Handler] | None = None, *,
                 lease: float = 30.0, backoff: float = 1.0, backoff_cap: float = 300.0,
                 heartbeat: float | str | None = AUTO, max_runtime: float | str | None = AUTO,
                 lossy_claim: bool = False, fair: Fair | str | None = None,
                 queues: Iterable[str] | str = (DEFAULT_QUEUE,),
                 tenant_setting: str = DEFAULT_TENANT_SETTING, hooks: Hooks | None = None) -> None:
        if not lease > 0 or lease == float("inf"):
            raise ConfigError(f"lease must be a positive number of seconds, not {lease!r}")
        if backoff < 0 or backoff_cap < 0:
            raise ConfigError(f"backoff must be 0 (off) or positive seconds, not {backoff!r}")
        interval = interval_for(float(lease), heartbeat)
        max_runtime = runtime_for(interval, max_runtime)
        check(float(lease), interval, max_runtime)
        if handlers is None:
            handlers = default_handlers
        self.handlers = handlers if isinstance(handlers, Handlers) else Handlers(handlers)
        self.lease, self.backoff, self.backoff_cap = float(lease), float(backoff), backoff_cap
        self.beat = HeartbeatConfig(self.lease, interval, max_runtime) if interval else None
        self.lossy_claim = lossy_claim
        #: A fair claim policy (fair.py) instead of the oldest job first; None = FIFO.
        self.fair = as_fair(fair)
        if self.fair and lossy_claim:
            raise ConfigError("lossy-claim has no fair variant: use one or the other")
        self._heartbeats: Heartbeats | None = None
        #: The worker's ``jobqueue.workers`` row, which the heartbeat refreshes during long jobs
        #: (set by Worker).
        self.presence: Presence | None = None
        #: The queues this worker serves, each once, in the order given.
        self.queues = parse_queues(queues)
        self.tenant_setting = check_setting(tenant_setting)
        self.hooks = hooks or NO_HOOKS

    def __repr__(self) -> str:
        extra = f", heartbeat={self.beat.interval:g}, max_runtime={self.beat.max_runtime}" \
            if self.beat else ", heartbeat=None"
        extra += f", fair={str(self.fair)!r}" if self.fair else ""
        extra += f", queues={list(self.queues)}" if self.queues != (DEFAULT_QUEUE,) else ""
        return f"Leased(lease={self.lease:g}, backoff={self.backoff:g}{extra})"

    def kinds(self) -> list[str]:
        """Return the job kinds this worker claims: those it has a handler for."""
        return sorted(self.handlers)

    # -- the statements (extension points) -----------------------------------------------------

    def claim_query(self, n: int, *, chained: bool = False) -> tuple[str, dict[str, Any]]:
        """Return the claim statement (FIFO, lossy or fair) for up to `n` jobs, and its parameters.

        ``chained``: the claim travels with a finish (or in a batch's transaction), whose commit
        is durable; lossy applies only to a claim that is a transaction of its own.
        """
        params: dict[str, Any] = {"lease": self.lease, "batch": n, "kinds": self.kinds(),
                                  "queues": list(self.queues)}
        if self.fair:
            return q(self.fair.query), params | self.fair.params
        lossy = self.lossy_claim and not chained
        name = "claim_leased" if len(self.queues) == 1 else "claim_leased_queues"
        return _limit_written(q(name + "_lossy" if lossy else name), n), params

    def start_query(self, claim: Claim) -> tuple[str, dict[str, Any]]:
        """Return the start: the tenant set locally, if this attempt still owns a live lease.

        One row back (the start time) = started; no row = not started (fenced).
        """
        return q("start_if_owner"), {"id": claim.id, "attempt": claim.attempt,
                                     "tenant": str(claim.tenant_id),
                                     "setting": self.tenant_setting}

    def finish_query(self, claim: Claim) -> tuple[str, dict[str, Any]]:
        """Return the finish: fenced (only the claimed attempt may finish), its job_runs row.

        One row back: (jobs finished, the run's id); 0 jobs finished = fenced out.
        """
        return q("complete_if_owner"), {"id": claim.id, "attempt": claim.attempt,
                                        "worker": claim.worker, "started": claim.started}

    # -- claim ---------------------------------------------------------------------------------

    def claim_many(self, conn: psycopg.Connection, n: int = 1, *, worker: str = "worker",
                   events: Events | None = None) -> list[Claim]:
        """Claim up to `n` claimable jobs of this worker's kinds, each leased."""
        events = events or NullEvents(worker)
        if self.beat is not None:
            # The heartbeat's session first: a job whose lease nobody can extend is not claimed.
            self.heartbeats(conn).connect()
        # Its own transaction (autocommit: one statement), committed before any work starts.
        with _autocommit(conn), conn.cursor(row_factory=class_row(Claim)) as cur:
            claims = cur.execute(*self.claim_query(n)).fetchall()
            if not claims and self.fair and self.fair.relist():
                # Round-robin walks the tenants it knows: nothing there, so list them all.
                claims = cur.execute(*self.claim_query(n)).fetchall()
        claims.sort(key=lambda c: c.id)
        self._claimed(conn, claims, worker, events)
        return claims

    def claim(self, conn: psycopg.Connection, *, worker: str = "worker",
              events: Events | None = None) -> Claim | None:
        """Claim the first claimable job; None when there is none."""
        claims = self.claim_many(conn, 1, worker=worker, events=events)
        return claims[0] if claims else None

    def heartbeats(self, conn: psycopg.Connection) -> Heartbeats:
        """Return this design's heartbeat (one per worker), started on first use."""
        if self.beat is None:
            raise ConfigError("this design has no heartbeat: pass heartbeat=SECONDS")
        if self._heartbeats is None:
            # Its connection as the worker's: no prepared statements behind a pooler.
            self._heartbeats = Heartbeats(dsn_of(conn), self.beat, name=_name(conn),
                                          presence=self.presence, overdue=self._overdue,
                                          pooler=conn.prepare_threshold is None)
        return self._heartbeats

    def heartbeat_ready(self, conn: psycopg.Connection) -> bool:
        """Whether the heartbeat's session is open (opened now if not); True without a heartbeat.

        Asked before a claim that rides on a finish: no claim when the session is refused.
        """
        if self.beat is None:
            return True
        try:
            self.heartbeats(conn).connect()
        except psycopg.OperationalError as e:
            log.warning("the heartbeat's session cannot be opened (%s): claiming nothing until "
                        "it can", str(e).strip().splitlines()[0] if str(e) else e)
            return False
        return True

    def _overdue(self, conn: psycopg.Connection, claim: Claim, runtime: float,
                 limit: float | None) -> None:
        """Fail an attempt past its maximum runtime, on the heartbeat's connection (fenced)."""
        text = (f"job {claim.id} ran longer than its maximum runtime ({limit or 0:g} s) at attempt "
                f"{claim.attempt} on {claim.worker}: failed by the watchdog after {runtime:.0f} s "
                "(its handler was not interrupted; its finish is fenced out)")
        try:
            with conn.transaction():
                # Never wait long: a batch of this worker (--batch-commit) holds its jobs' rows
                # locked until it commits, and fails such a job itself when its handler returns.
                conn.execute(q("lock_timeout_local"), {"ms": f"{OVERDUE_LOCK_TIMEOUT_MS}ms"})
                row = conn.execute(*self._fail_query(claim, text)).fetchone()
        except psycopg.errors.LockNotAvailable:
            log.warning("job %s attempt %s: its row is locked (by a batch of this worker): the "
                        "batch fails the attempt when its handler returns", claim.id, claim.attempt)
            return
        self._failed(claim, text, row, claim.events)

    # -- execute -------------------------------------------------------------------------------

    def execute(self, conn: psycopg.Connection, claim: Claim, work: Work | None = None, *,
                worker: str | None = None, events: Events | None = None,
                claim_next: int | Callable[[], int] = 0) -> Outcome:
        """Run the job's handler as its tenant, and complete it if this attempt still owns it.

        The handler's errors propagate (``run_claimed`` hands them to ``fail``). A claim whose
        lease ran out before the start is not started; when the fence says another attempt owns
        the job, everything this execution wrote rolls back: both are "fenced".
        ``claim_next``: also claim up to that many jobs in the finish's commit (one durable
        commit per job, not two); they are in the outcome's ``claimed``, counted and leased. A
        callable is asked at the finish (a worker told to stop meanwhile claims nothing).
        """
        if worker is not None:
            claim.worker = worker
        if events is not None:
            claim.events = events
        ev = claim.events
        step = "start"
        try:
            try:
                with _work_transaction(conn):
                    if not self._start(conn, claim):
                        raise LeaseLost(f"job {claim.id} lease ran out before its start at "
                                        f"attempt {claim.attempt}: not started")
                    step = "complete"
                    fn = work or self.handlers.lookup(claim)
                    self.hooks.before_start(claim)
                    with client_binding(conn):
                        result = call_handler(fn, conn, claim)
                    # The heartbeat covers the work only: released before the finish, a beat
                    # can never run into this attempt's own completion and call it lost.
                    self.release(claim)
                    more = claim_next() if callable(claim_next) else claim_next
                    if more and not self.heartbeat_ready(conn):
                        more = 0
                    finished, claimed = self._complete(conn, claim, more)
                    if not finished:
                        raise LeaseLost(f"job {claim.id} lease lost at attempt {claim.attempt}")
                    if more and self.chain_claims and not claimed and self.on_idle is not None:
                        # Nothing left to claim: idle from this commit on, in the same one.
                        self.on_idle(conn)
            finally:
                self.release(claim)
        except LeaseLost as e:
            ev.emit("fenced", job=claim.id, attempt=claim.attempt, step=step)
            # Rolled back; the attempt's record is written on its own.
            with _autocommit(conn):
                outcome = self._record_fenced(conn, claim, str(e))
            fenced = Outcome(claim, "cancelled" if outcome == "cancelled" else "fenced",
                             error=str(e))
            after_finish(self.hooks, claim, fenced)
            return fenced
        ev.emit("finish", job=claim.id, attempt=claim.attempt, result=result)
        logs.done(claim)
        # Committed: the next jobs are this worker's now.
        self._claimed(conn, claimed, claim.worker, ev)
        done = Outcome(claim, "done", result=result, claimed=claimed)
        after_finish(self.hooks, claim, done)
        return done

    def _record_fenced(self, conn: psycopg.Connection, claim: Claim, why: str) -> str:
        """Write a fenced attempt's job_runs row ('cancelled' if an operator cancelled it)."""
        row = conn.execute(q("record_fenced"), {
            "id": claim.id, "attempt": claim.attempt, "worker": claim.worker,
            "started": claim.started, "error": why}).fetchone()
        outcome = str(row[0]) if row else "fenced"
        logs.fenced(claim, outcome, why)
        return outcome

    def _start(self, conn: psycopg.Connection, claim: Claim) -> bool:
        """Start the job (tenant set locally) if it is still this attempt's; False: fenced."""
        # Bound client-side, sent by the simple protocol: no portal (and no snapshot) stays
        # open while the handler runs, in one round trip; and the server's
        # idle_in_transaction_session_timeout keeps working (after a pipeline it does not).
        cur = psycopg.ClientCursor(conn).execute(*self.start_query(claim))
        return self._started(claim, cur.fetchone())

    def _started(self, claim: Claim, row: Any) -> bool:
        if not row:
            return False
        claim.started = row[0]
        claim.events.emit("execute", job=claim.id, attempt=claim.attempt,
                          tenant=claim.tenant_id, kind=claim.kind)
        return True

    def _complete(self, conn: psycopg.Connection, claim: Claim,
                  claim_next: int = 0) -> tuple[bool, list[Claim]]:
        """Finish the job if this attempt still owns it (False = fenced out); claim the next.

        The claim goes out with the finish, pipelined (one round trip) and committed with it:
        a fenced finish raises, and the claim rolls back with everything else.
        """
        chain = claim_next and self.chain_claims
        with conn.pipeline():
            done = conn.execute(*self.finish_query(claim))
            if chain:
                cur = conn.cursor(row_factory=class_row(Claim))
                cur.execute(*self.claim_query(claim_next, chained=True))
        row = done.fetchone()
        finished = bool(row and row[0])
        if finished and row is not None:
            claim.run_id = row[1]
        if not (finished and chain):
            return finished, []
        return True, sorted(cur.fetchall(), key=lambda c: c.id)

    def _claimed(self, conn: psycopg.Connection, claims: list[Claim], worker: str,
                 events: Events) -> None:
        for c in claims:
            c.worker, c.events = worker, events
            events.emit("claim", job=c.id, attempt=c.attempt, tenant=c.tenant_id, kind=c.kind)
            if self.beat is not None:
                # From the claim: a batch's later jobs keep their leases while they wait.
                self.heartbeats(conn).hold(c, self.handlers.max_runtime(c.kind))

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
        text = error_detail(error)
        with _autocommit(conn):
            row = conn.execute(*self._fail_query(claim, text)).fetchone()
        outcome = self._failed(claim, text, row, ev, exc=error)
        on_failure(self.hooks, claim, outcome, error)
        return outcome

    def _fail_query(self, claim: Claim, text: str) -> tuple[str, dict[str, Any]]:
        """Return the fenced fail, which also writes the attempt's job_runs row."""
        return q("fail_if_owner"), {"id": claim.id, "attempt": claim.attempt, "error": text,
                                    "worker": claim.worker, "started": claim.started,
                                    "backoff": self.backoff, "backoff_cap": self.backoff_cap}

    def _failed(self, claim: Claim, text: str, row: Any, ev: Events, *,
                emit: bool = True, exc: BaseException | None = None) -> Outcome:
        if row is None:
            if emit:
                ev.emit("fenced", job=claim.id, attempt=claim.attempt, step="fail", error=text)
            logs.fenced(claim, "fenced", f"its failure came after the lease was lost: {text}")
            return Outcome(claim, "fenced", error=text)
        status, _attempts, run_after = row
        logs.failed(claim, status, text, exc, run_after)
        if emit:
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
            if broken(conn) or pooler_error(e, conn):
                # The connection is gone: the job's lease expires and it is retried, counted
                # (the worker reconnects). A pooler's prepared-statement clash is the worker's
                # configuration, not the job's fault. Any other error is the job's own.
                raise
            return self.fail(conn, claim, e)

    def run_one(self, conn: psycopg.Connection, work: Work | None = None, *,
                worker: str = "worker", events: Events | None = None) -> Outcome | None:
        """Claim, execute, and on error fail the first claimable job; None when there is none."""
        claim = self.claim(conn, worker=worker, events=events)
        if claim is None:
            return None
        return self.run_claimed(conn, claim, work)

    def run_together(self, conn: psycopg.Connection, claims: list[Claim], *,
                     claim_next: int | Callable[[], int] = 0) -> list[Outcome]:
        """Run claimed jobs one after another in one transaction, one commit for them all.

        The batch's first statement checks every claim's fence (this attempt, running, lease
        live) and locks the rows of those that pass until the commit (``lock_batch_if_owner``):
        no other session can take, reap or cancel them meanwhile, so each fence holds from the
        batch's start to its commit. A job's savepoint and tenant (set locally, bound) go out in
        one round trip right before the first statement its handler sends (``_Preamble``; a
        handler that sends none costs none), nothing after it: the jobs that succeeded are
        finished together, fenced by their attempts, in one statement with the next claim and
        the COMMIT (``complete_batch_if_owner``). A job that fails (a statement timeout, a
        deadlock: any error on a connection that is still up) rolls back to its savepoint and
        its failure is counted in the same transaction: the batch goes on. One fsync for the
        batch instead of one per job; the prices: a lost connection or a crash before that
        commit loses every finish of the batch (their attempts were counted at the claim: they
        run again, counted), and the row locks take a transaction id at the batch's start, so
        the batch holds the VACUUM horizon (and ``cancel`` of its jobs waits) until it commits.
        """
        if claims and (self.start_query(claims[0])[0] != q("start_if_owner")
                       or self.finish_query(claims[0])[0] != q("complete_if_owner")):
            # A design with statements of its own (the extension points): they run, per job.
            return self._run_together_per_job(conn, claims, claim_next=claim_next)
        results: list[tuple[Claim, Outcome]] = []
        errors: dict[int, BaseException] = {}  # job id -> what its handler raised
        claimed: list[Claim] = []
        ok: list[tuple[Claim, Any]] = []  # (claim, result) of the jobs that succeeded
        ended: dict[int, Any] = {}  # job id -> its end (the server's clock, see `at`)
        hooks, handlers, setting = self.hooks, self.handlers, self.tenant_setting
        before_start = None if type(hooks).before_start is Hooks.before_start \
            else hooks.before_start
        with _batch_transaction(conn) as own:
            # Simple protocol, bound client-side: one message per step, no portal (and no
            # snapshot) left open while a handler runs. BEGIN travels with the lock.
            cur = psycopg.ClientCursor(conn)
            cur.execute(q("begin") + "\n" + q("lock_batch_if_owner") if own
                        else q("lock_batch_if_owner"),
                        {"ids": [c.id for c in claims], "attempts": [c.attempt for c in claims]})
            if own:
                cur.nextset()
            rows = cur.fetchall()
            owned = {r[0] for r in rows}
            # The server's clock at the lock; each job's start and end are read from it plus the
            # time passed here since (monotonic): no round trip per job for the clock.
            at, since = (rows[0][1] if rows else None), time.monotonic()
            start, before = q("start_in_batch"), conn.cursor_factory
            for c in claims:
                if c.id not in owned:
                    self.release(c)
                    why = (f"job {c.id} lease ran out before its start at attempt {c.attempt}: "
                           "not started")
                    # Its record commits with the batch (logged now: the batch goes on).
                    self._record_fenced(conn, c, why)
                    results.append((c, Outcome(c, "fenced", error=why)))
                    continue
                # Its fence is held (locked above). Its savepoint and tenant go out right before
                # the first statement its handler (or before_start) sends: none, no round trip.
                c.started = at + timedelta(seconds=time.monotonic() - since) if at else None
                c.events.emit("execute", job=c.id, attempt=c.attempt, tenant=c.tenant_id,
                              kind=c.kind)
                pre = _Preamble(conn, cur, start, {"setting": setting, "tenant": str(c.tenant_id)})
                conn.cursor_factory = psycopg.ClientCursor  # client_binding, inlined
                try:
                    fn = handlers.lookup(c)
                    if before_start is not None:
                        before_start(c)
                    if not c.cancel_seen:
                        with _no_commit(conn):
                            result = call_handler(fn, conn, c)
                    if conn.info.transaction_status == INERROR:
                        # A statement of its handler failed and the handler went on: its own
                        # error (the next job's statements would meet the aborted transaction).
                        raise HandlerExit(f"the handler of job {c.id} ({c.kind}) returned after "
                                          "a statement of its own failed: the job fails")
                    if c.cancel_seen:
                        # The watchdog let it go (past its maximum runtime, counted from its
                        # claim) before or while it ran: it cannot fail the attempt, whose row
                        # this batch holds locked; the batch fails it here, counted.
                        raise Overdue(f"job {c.id} ran longer than its maximum runtime at "
                                      f"attempt {c.attempt} on {c.worker}: failed by the watchdog")
                    ok.append((c, result))
                    if at is not None:
                        ended[c.id] = at + timedelta(seconds=time.monotonic() - since)
                except BaseException as e:
                    pre.off()
                    if broken(conn) or not isinstance(e, Exception) or pre.failed:
                        # The connection is gone (the worker reconnects), a stop, or the
                        # batch's own statement failed: the whole batch rolls back.
                        raise
                    # The job's own error: the connection is fine. Back to its savepoint, if
                    # its handler sent anything (else there is nothing to undo).
                    if pre.sent:
                        cur.execute(q("rollback_job"))
                    text = error_detail(e)
                    errors[c.id] = e
                    row = cur.execute(*self._fail_query(c, text)).fetchone()
                    results.append((c, self._failed(c, text, row, c.events, emit=False, exc=e)))
                finally:
                    pre.off()
                    conn.cursor_factory = before
                    self.release(c)
            more = claim_next() if callable(claim_next) else claim_next
            more = more if more and self.heartbeat_ready(conn) else 0
            with conn.pipeline():
                done = conn.execute(q("complete_batch_if_owner"), {
                    "ids": [c.id for c, _ in ok], "attempts": [c.attempt for c, _ in ok],
                    "started": [c.started for c, _ in ok],
                    "finished": [ended.get(c.id) for c, _ in ok],
                    "worker": claims[0].worker if claims else "worker"}) if ok else None
                if more:
                    # The worker's own claim (FIFO or fair), durable: it commits with the batch.
                    claim_cur = conn.cursor(row_factory=class_row(Claim))
                    claim_cur.execute(*self.claim_query(more, chained=True))
                if own:
                    # COMMIT in the same round trip (a finish is never fenced out by another
                    # session here: the rows are locked). An error above skips it: rolled back.
                    conn.execute(q("commit"), prepare=False)
            runs: dict[int, int] = dict(done.fetchall()) if done is not None else {}
            if more:
                claimed = sorted(claim_cur.fetchall(), key=lambda c: c.id)
            for c, result in ok:
                if (run := runs.get(c.id)) is not None:
                    c.run_id = run
                    results.append((c, Outcome(c, "done", result=result)))
                    continue
                # Only this transaction can have changed a locked row: a handler that wrote its
                # own (or another batch job's) row. Not rolled back (that would undo the jobs
                # after it, which then ran twice): recorded fenced, logged.
                why = (f"job {c.id} attempt {c.attempt}: its row was changed inside the batch's "
                       "own transaction (by a handler), its finish matched nothing")
                log.warning("%s", why)
                self._record_fenced(conn, c, why)
                results.append((c, Outcome(c, "fenced", error=why)))
        # Committed: now it happened, and the events say so (in the claims' order).
        order = {c.id: i for i, c in enumerate(claims)}
        results.sort(key=lambda r: order[r[0].id])
        return self._committed(conn, claims, results, errors, claimed)

    def _committed(self, conn: psycopg.Connection, claims: list[Claim],
                   results: list[tuple[Claim, Outcome]], errors: dict[int, BaseException],
                   claimed: list[Claim]) -> list[Outcome]:
        """After a batch's commit: its events, its hooks, and the jobs it claimed."""
        for c, o in results:
            ev = c.events
            if o.status == "done":
                ev.emit("finish", job=c.id, attempt=c.attempt, result=o.result)
                logs.done(c)
            elif o.status == "fenced":
                ev.emit("fenced", job=c.id, attempt=c.attempt, step="complete")
            else:
                ev.emit("fail", job=c.id, attempt=c.attempt, error=o.error, counted=True)
                if o.status == "dead":
                    ev.emit("dead", job=c.id, attempt=c.attempt)
        if self.hooks is not NO_HOOKS:
            for c, o in results:
                if c.id in errors:
                    on_failure(self.hooks, c, o, errors[c.id])
                else:
                    after_finish(self.hooks, c, o)
        if claims:
            self._claimed(conn, claimed, claims[-1].worker, claims[-1].events)
            results[-1][1].claimed = claimed
        return [o for _, o in results]

    def _run_together_per_job(self, conn: psycopg.Connection, claims: list[Claim], *,
                              claim_next: int | Callable[[], int] = 0) -> list[Outcome]:
        """Run a batch in one transaction through the design's own start and finish, per job.

        For a subclass that changes ``start_query`` or ``finish_query`` (the lab's naive
        design): its statements, one job after another, as before the locked batch.

        Each job runs in a savepoint of its own: its start and finish fenced on their own, its
        tenant set locally. A job that fails (a statement timeout, a deadlock: any error on a
        connection that is still up) or is fenced rolls back to its savepoint, and a failure is
        counted in the same transaction: the batch goes on. One fsync for the batch instead of
        one per job; the price: a lost connection or a crash before that commit loses every
        finish of the batch (their attempts were counted at the claim: they run again, counted).
        """
        results: list[tuple[Claim, Outcome]] = []
        errors: dict[int, BaseException] = {}  # job id -> what its handler raised
        claimed: list[Claim] = []
        with _work_transaction(conn):
            started: dict[int, bool] = {}  # job index -> its start was sent (and succeeded)
            for i, c in enumerate(claims):
                # Savepoint j<i> is never released: a fenced or failing job rolls back to it.
                # Pipelined, a done job costs one round trip: its fenced finish travels with
                # the next job's savepoint and start (a fenced finish rolls those back too,
                # and the next job starts again).
                try:
                    if i not in started:
                        with conn.pipeline():
                            conn.execute(f"savepoint j{i}")
                            cur = conn.execute(*self.start_query(c))
                            release_snapshot(conn)
                        started[i] = self._started(c, cur.fetchone())
                    if not started[i]:
                        raise LeaseLost(f"job {c.id} lease ran out before its start at attempt "
                                        f"{c.attempt}: not started")
                    fn = self.handlers.lookup(c)
                    self.hooks.before_start(c)
                    with client_binding(conn):
                        result = call_handler(fn, conn, c)
                    self.release(c)
                    nxt = claims[i + 1] if i + 1 < len(claims) else None
                    with conn.pipeline():
                        done = conn.execute(*self.finish_query(c))
                        if nxt is not None:
                            conn.execute(f"savepoint j{i + 1}")
                            cur = conn.execute(*self.start_query(nxt))
                            release_snapshot(conn)
                    if not (row := done.fetchone()) or not row[0]:
                        raise LeaseLost(f"job {c.id} lease lost at attempt {c.attempt}")
                    c.run_id = row[1]
                    if nxt is not None:
                        started[i + 1] = self._started(nxt, cur.fetchone())
                    results.append((c, Outcome(c, "done", result=result)))
                except BaseException as e:
                    self.release(c)
                    if broken(conn) or not isinstance(e, Exception):
                        raise  # the connection is gone (the worker reconnects), or a stop
                    # The job's own error (or its fence): the connection is fine. Back to its
                    # savepoint (the next job's start, if it was sent, goes with it).
                    conn.execute(f"rollback to savepoint j{i}")
                    started.pop(i + 1, None)
                    if isinstance(e, LeaseLost):
                        # Its record commits with the batch (logged now: the batch goes on).
                        self._record_fenced(conn, c, str(e))
                        results.append((c, Outcome(c, "fenced", error=str(e))))
                        continue
                    text = error_detail(e)
                    errors[c.id] = e
                    row = conn.execute(*self._fail_query(c, text)).fetchone()
                    results.append((c, self._failed(c, text, row, c.events, emit=False, exc=e)))
            more = claim_next() if callable(claim_next) else claim_next
            if more and self.heartbeat_ready(conn):
                with conn.cursor(row_factory=class_row(Claim)) as claim_cur:
                    # The worker's own claim (FIFO or fair), durable: it commits with the batch.
                    claimed = sorted(
                        claim_cur.execute(*self.claim_query(more, chained=True)).fetchall(),
                        key=lambda c: c.id)
        # Committed: now it happened, and the events say so.
        return self._committed(conn, claims, results, errors, claimed)

    def close(self) -> None:
        """Stop the heartbeat's thread and close its connection."""
        if self._heartbeats is not None:
            self._heartbeats.close()


#: Sent right after a start, in the same round trip. The start is a query with parameters:
#: its (unnamed) portal, and the snapshot the portal registered, would stay open until the
#: next statement. A handler that never queries would then hold back the horizon (VACUUM, the
#: queue's index scans) for its whole run, with no transaction id to show for it. CLOSE ALL
#: takes the unnamed portal's place and closes the rest: it holds no snapshot of its own.
RELEASE_SNAPSHOT = "close all"


def call_handler(fn: Handler | Work, conn: psycopg.Connection, claim: Claim) -> Any:
    """Call the handler; its ``SystemExit`` is the job's error, not the worker's end.

    A handler that calls ``sys.exit()`` (or a library that does) would otherwise stop the
    worker with that status and no log line, and a supervisor would not restart it on 0.
    A child the handler forked that returns or raises (``sys.exit()``) instead of calling
    ``os._exit()`` comes back here too: it ends at once (``child_exit``), before it could run
    the worker's code on the parent's sessions (a rollback, a finish, a Terminate on exit).
    """
    pid = os.getpid()
    try:
        result = fn(conn, claim)
    except BaseException as e:
        if os.getpid() != pid:
            child_exit(e)
        if isinstance(e, SystemExit):
            raise HandlerExit(f"the handler of job {claim.id} ({claim.kind}) raised "
                              f"SystemExit({e.code!r}): a handler may not end the worker") from e
        raise
    if os.getpid() != pid:
        child_exit(None)
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        # A raw COMMIT (or ROLLBACK) ended the work's transaction: what the handler wrote before
        # it is committed whatever the fence says next. Not hidden: the attempt fails, and the
        # README's handler rules say why a handler never ends its transaction.
        raise HandlerExit(f"the handler of job {claim.id} ({claim.kind}) ended the work's "
                          "transaction (a COMMIT or ROLLBACK of its own): its writes escaped "
                          "the fence; a handler leaves the transaction to the worker")
    return result


def child_exit(error: BaseException | None) -> NoReturn:
    """End a process a handler forked that came back into the worker: at once, with its status.

    ``os._exit``: no finalizer, no atexit, so the parent's sessions (inherited sockets) are
    never written to (psycopg sends a Terminate when a connection is closed or collected).
    """
    code = 0
    if isinstance(error, SystemExit):
        code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    elif error is not None:
        code = 1
        traceback.print_exception(error)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class HandlerExit(JobQueueError):
    """A handler raised SystemExit or ended the work's transaction: the job fails (counted);
    the worker goes on."""


class _Preamble:
    """Send a job's savepoint and tenant right before the first statement of its handler.

    Set as the connection's ``wait`` (every statement psycopg sends goes through it) while the
    handler runs: the first call sends `query` (a savepoint, the tenant set locally, bound
    client-side) and reads its results, then goes on with what the handler asked. A handler
    that sends nothing costs nothing. ``sent``: it went out; ``failed``: it failed (the batch's
    own statement: the batch rolls back). ``off()`` puts the connection's own wait back.

    It relies on psycopg sending every statement through ``Connection.wait`` (true of execute,
    cursors of every kind, COPY, transactions and pipelines in psycopg 3.2 and 3.3); the tests
    of a batch's tenants (a client-side and a server-side cursor) fail the day it is not. A
    handler that talks to ``conn.pgconn`` (libpq) itself bypasses it: it runs as the tenant of
    the job before it, outside its savepoint.
    """

    def __init__(self, conn: psycopg.Connection, cur: psycopg.ClientCursor[Any], query: str,
                 params: dict[str, Any]) -> None:
        self.conn, self.cur, self.query, self.params = conn, cur, query, params
        self.sent = self.failed = False
        self.wait = conn.wait
        conn.wait = self  # type: ignore[method-assign]

    def __call__(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        self.off()
        self.sent = True
        pgconn = self.conn.pgconn
        # Bound client-side (psycopg quotes the tenant), sent by the simple protocol.
        pgconn.send_query(self.cur.mogrify(self.query, self.params).encode(
            self.conn.info.encoding))
        for res in self.wait(execute(pgconn)):  # called with the connection's lock held
            if res.status == psycopg.pq.ExecStatus.FATAL_ERROR:
                self.failed = True
                raise JobQueueError(f"a batch's savepoint and tenant failed: "
                                    f"{(res.error_message or b'').decode(errors='replace')}")
        return self.wait(gen, *args, **kwargs)

    def off(self) -> None:
        self.conn.__dict__.pop("wait", None)


@contextmanager
def _no_commit(conn: psycopg.Connection) -> Iterator[None]:
    """Forbid ``conn.commit()`` and ``conn.rollback()`` while a batch's handler runs.

    The batch sends BEGIN and COMMIT itself, outside psycopg's ``transaction()``, where psycopg
    would refuse them: a handler's ``commit()`` would commit the jobs before it, unfinished, and
    end the batch. It raises ``ProgrammingError`` instead, as psycopg does inside
    ``transaction()``: that job fails, alone, and the batch goes on.
    """
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise psycopg.ProgrammingError(
            "a handler may not commit or roll back: the worker ends the work's transaction "
            "(raise to fail the job; conn.transaction() for a savepoint of its own)")

    conn.commit = conn.rollback = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        conn.__dict__.pop("commit", None)
        conn.__dict__.pop("rollback", None)


class Overdue(JobQueueError):
    """A job of a locked batch ran past its maximum runtime: it fails there (counted)."""


@contextmanager
def client_binding(conn: psycopg.Connection) -> Iterator[None]:
    """Run a handler with client-side binding (``psycopg.ClientCursor``, the simple protocol).

    Sent with server-side binding, a query with parameters leaves its portal, and the snapshot
    the portal holds, open until the next statement: a handler that reads and then waits on
    something else (an HTTP call, a sleep) would hold back the horizon for that long. Bound
    client-side, nothing stays open. A handler that wants server-side binding (binary data,
    prepared statements) asks for it with ``psycopg.Cursor(conn)``, and then keeps it short.
    """
    before = conn.cursor_factory
    conn.cursor_factory = psycopg.ClientCursor
    try:
        yield
    finally:
        conn.cursor_factory = before


def release_snapshot(conn: psycopg.Connection) -> None:
    """Close what the last statement left open (its portal and snapshot) before a handler runs."""
    conn.execute(RELEASE_SNAPSHOT)


def broken(conn: psycopg.Connection) -> bool:
    """Return True when `conn` can no longer be used: the server or the network went away.

    What tells an outage from a job's own error (a statement timeout, a lock timeout, a
    deadlock, a serialization failure: all OperationalError subclasses, on a connection that
    is still fine).
    """
    return bool(conn.closed or conn.broken)


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
def _batch_transaction(conn: psycopg.Connection) -> Iterator[bool]:
    """Run a batch's transaction; yield True when the caller sends BEGIN and COMMIT itself.

    On an autocommit connection with no transaction open (the worker's), BEGIN travels with the
    batch's first statement and COMMIT with its last: two round trips fewer. Otherwise (a
    caller's own transaction, or a connection that is not autocommit) ``conn.transaction()``.
    A COMMIT that did not go out is sent at the end; an error rolls back (the connection up).
    """
    if not (conn.autocommit
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE):
        with conn.transaction():
            yield False
        return
    try:
        yield True
    except BaseException:
        if not broken(conn):
            conn.rollback()
        raise
    conn.commit()  # nothing left open: a no-op when the COMMIT went with the last statement


@contextmanager
def _work_transaction(conn: psycopg.Connection) -> Iterator[None]:
    with conn.transaction():
        yield
