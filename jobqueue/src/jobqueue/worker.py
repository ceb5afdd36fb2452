"""Run a worker: claim and run jobs until told to stop, surviving the server going away.

Stops cleanly on SIGTERM/SIGINT after its current job (or batch); a second signal stops it at
once (the job in flight then rolls back; its lease expires and it is retried, counted). It
refuses to start without handlers or on a schema that is missing or behind (``ConfigError``).
An idle worker waits on LISTEN (``enqueue`` notifies in its own transaction) with the
poll as the fallback. A lost connection (server restart, failover, a dropped TCP connection)
is logged once per outage and reopened with capped, jittered backoff; the job in flight then is
neither finished nor lost: its lease expires and it is retried, counted. A statement that fails
on a connection that is still up (a claim that hit a statement or lock timeout) is not an
outage: the worker logs it and goes on.

Exit statuses, for supervisors (systemd ``RestartPreventExitStatus=2``, k8s):
``0`` stopped (signal, ``--max-jobs``, ``--until-empty``); ``1`` crashed (a bug, or a job that
ended the process); ``2`` bad configuration; ``3`` lost the server for longer than
``--max-outage``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import secrets
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import psycopg

from .handlers import Handlers
from .heartbeat import Presence
from .hooks import Hooks
from .jobs import Claim, ConfigError, Events, JobQueueError, NullEvents, Outcome, error_text
from .leased import Leased, broken
from .options import WorkerOptions
from .periodic import Periodic, Schedules
from .periodic import schedules as default_schedules
from .preflight import connect, diagnose, preflight, refused_login
from .queries import q

APP = (__package__ or "jobqueue").split(".")[0]
log = logging.getLogger(APP)

EXIT_STOPPED, EXIT_CRASHED, EXIT_CONFIG, EXIT_SERVER_LOST = 0, 1, 2, 3

#: Seconds a worker's ``jobqueue.workers`` row lives without a refresh (at least twice the
#: lease): a worker silent for longer counts as stopped.
PRESENCE_TTL = 60.0

#: What "the server is gone" looks like: a restart, a dropped connection, or after a failover a
#: host that is now a read-only standby. The worker reconnects; anything else is a bug.
#: The server ending the session on its side is an outage too: an idle-in-transaction or a
#: transaction timeout (25P03, 25P04, raised as InternalError), an administrator's or a
#: shutdown's termination (class 57P: OperationalError).
LOST = (psycopg.OperationalError, psycopg.InterfaceError, psycopg.errors.ReadOnlySqlTransaction,
        psycopg.errors.IdleInTransactionSessionTimeout, psycopg.errors.TransactionTimeout)
#: A statement that fails this many times in a row on a healthy connection is not a passing
#: trouble: the worker stops (exit 2) with its cause instead of "trying again" for ever.
#: Errors of configuration (a grant revoked, a table or column missing: SQLSTATE class 42)
#: stop it sooner.
MAX_FAILED_ROUNDS, MAX_FAILED_ROUNDS_CONFIG = 30, 3


class ServerLost(JobQueueError):
    """The server stayed unreachable for longer than the worker's ``max_outage``."""


class Outage:
    """Reconnect with capped, jittered backoff; one log line per outage; give up after a limit."""

    def __init__(self, who: str, limit: float | None, *, first: float = 0.1, cap: float = 5.0,
                 sleep: Callable[[float], Any] = time.sleep) -> None:
        self.who, self.limit, self.first, self.cap, self.sleep = who, limit, first, cap, sleep
        self.since: float | None = None
        self.tries = 0
        self.outages = 0

    def failed(self, error: BaseException) -> None:
        """Record a failed connection; wait before the next try, or raise ServerLost."""
        now = time.monotonic()
        if self.since is None:
            self.since, self.tries = now, 0
            self.outages += 1
            log.warning("%s lost the server (%s): reconnecting",
                        self.who, str(error).strip().splitlines()[0] if str(error) else error)
        if self.limit is not None and now - self.since > self.limit:
            raise ServerLost(f"{self.who} could not reach the server for {now - self.since:.0f} s "
                             f"(limit {self.limit:g} s): {error}") from error
        self.tries += 1
        # Full jitter: workers that lost the server together do not come back in lockstep.
        self.sleep(random.uniform(0, min(self.cap, self.first * 2 ** self.tries)))

    def ok(self) -> None:
        """Record a working connection: the outage, if any, is over."""
        if self.since is not None:
            log.info("%s is back after %.1f s (%d tries)", self.who,
                     time.monotonic() - self.since, self.tries)
            self.since = None


class Worker:
    """Claim and run jobs in a loop; stop between jobs when asked; reconnect when cut off.

    ``queue``: a ``Leased`` (or a subclass of it) instead of the one made from ``options``,
    ``handlers`` and ``hooks``. ``run_round`` is the extension point for a subclass that runs
    jobs its own way: the loop around it (reconnects, LISTEN, stops, periodic jobs) stays.
    """

    def __init__(self, dsn: str, options: WorkerOptions | None = None,
                 handlers: Handlers | dict[str, Any] | None = None, *,
                 queue: Leased | None = None, events: Events | None = None,
                 schedules: Schedules | None = None, hooks: Hooks | None = None) -> None:
        if queue is not None and hooks is not None:
            raise ConfigError("hooks belong to the queue: pass them to the Leased given as queue")
        self.dsn = dsn
        self.options = o = options or WorkerOptions()
        # Host, pid and a few random letters: in containers every worker is pid 1 or 7.
        self.name = o.name or (
            f"worker-{socket.gethostname()[:20]}-{os.getpid()}-{secrets.token_hex(2)}")
        self.events = events or NullEvents(self.name)
        self.queue = queue or Leased(handlers, lease=o.lease, backoff=o.backoff,
                                     heartbeat=o.heartbeat_setting(),
                                     max_runtime=o.max_runtime, lossy_claim=o.lossy_claim,
                                     fair=o.fair, queues=o.queues,
                                     tenant_setting=o.tenant_setting, hooks=hooks)
        self.stopping = False
        self.claimed = 0
        self.outage = Outage(self.name, o.max_outage, sleep=self._sleep)
        #: Its ``jobqueue.workers`` row: alive, and the kinds it serves (``stats`` reads it);
        #: None: the worker does not announce itself.
        self.presence: Presence | None = Presence(
            self.name, list(self.queue.kinds()), ttl=max(PRESENCE_TTL, 2 * o.lease))
        self.queue.presence = self.presence
        #: The periodic jobs this worker enqueues as their slots come (periodic.py); default:
        #: the package's ``schedules`` registry.
        self.schedules = default_schedules if schedules is None else schedules
        self.periodic = Periodic(self.schedules)

    def stop(self, signum: int | None = None, frame: object = None) -> None:
        """Finish the current job, then stop; a second call stops at once."""
        if self.stopping:
            raise KeyboardInterrupt
        self.stopping = True
        self.events.emit("stop-requested", signal=signum)

    def run(self) -> int:
        """Run until stopped; return how many jobs were claimed.

        Raises ServerLost (the server was away for longer than ``max_outage``) and ConfigError
        (no handlers; a server never reached, a failed login, no such database; the schema
        missing or behind; a grant missing).
        """
        if not self.queue.handlers:
            raise ConfigError("no handlers registered: pass --handlers MODULE, a module that "
                              "registers its functions with @handlers.register(KIND)")
        # Never reached, or reached and wrong (login, database, schema, grants): a
        # configuration error now, not an outage to wait out for ever.
        preflight(self.dsn, self.name)
        self.events.emit("worker-start", **dataclasses.asdict(self.options))
        try:
            while not self.stopping:
                try:
                    with connect(self.dsn, self.name) as conn:
                        self.outage.ok()
                        if self._serve(conn):
                            break
                except LOST as e:
                    if self.stopping:
                        break
                    if refused_login(e):
                        # Refused, not cut off (the password or the database changed since the
                        # start): reconnecting for ever would never help.
                        raise ConfigError(diagnose(e)) from e
                    self.outage.failed(e)
        finally:
            self.queue.close()
            self.events.emit("worker-stop", claimed=self.claimed)
        return self.claimed

    def _serve(self, conn: psycopg.Connection) -> bool:
        """Run jobs on one connection; True when the worker is done (not merely cut off)."""
        o = self.options
        listening = o.listen and self._listen(conn)
        presence = self.presence
        if presence is not None:
            presence.touch(conn, start=presence.last == -math.inf)
        idle = False
        failed = 0  # rounds in a row that failed on a healthy connection
        pending: list[Claim] = []
        # Jobs already claimed (with the last finish) are part of the current job: run them
        # even when a stop was asked for meanwhile.
        while pending or not self.stopping:
            if presence is not None and presence.due():
                presence.touch(conn)
            try:
                if len(self.schedules):
                    self.periodic.tick(conn)  # a clock comparison unless a slot has come
                outcomes = self.run_round(conn, pending)
            except psycopg.Error as e:
                if broken(conn) or isinstance(e, psycopg.errors.ReadOnlySqlTransaction):
                    raise  # an outage: reconnect
                # A statement failed on a healthy connection (a claim that hit a statement or
                # lock timeout): not the server going away. The jobs in hand, if any, are let
                # go; their leases run out and they are retried, counted.
                failed += 1
                limit = (MAX_FAILED_ROUNDS_CONFIG if (e.sqlstate or "").startswith("42")
                         else MAX_FAILED_ROUNDS)
                if failed >= limit:
                    raise ConfigError(f"{self.name}: the same statement failed {failed} times in "
                                      f"a row on a working connection: {error_text(e)} (check "
                                      "the grants, the migrations and the schedules)") from e
                log.warning("%s: %s; trying again (%d of %d)", self.name, error_text(e),
                            failed, limit)
                pending = []
                self._sleep(1.0)
                continue
            failed = 0
            if listening and outcomes:
                # Busy, the worker never waits for a NOTIFY: psycopg would keep every one that
                # came in meanwhile (memory growing with the enqueues). Dropped here: the next
                # claim looks at the table anyway.
                for _ in conn.notifies(timeout=0):
                    pass
            pending = outcomes[-1].claimed if outcomes else []
            if not outcomes:
                if o.until_empty:
                    return self._done(conn)
                if not idle:
                    self.events.emit("idle")
                    idle = True
                self._wait(conn, listening)
                continue
            idle = False
            self.claimed += len(outcomes)
            if o.max_jobs is not None and self.claimed >= o.max_jobs and not pending:
                return self._done(conn)
        return self._done(conn)

    def _done(self, conn: psycopg.Connection) -> bool:
        """Stopped: remove this worker's row (it serves nothing any more); True."""
        if self.presence is not None:
            self.presence.gone(conn)
        return True

    def _goes_on(self, after: int) -> bool:
        """Whether the worker will want another job after `after` more: then claim it early."""
        o = self.options
        return not self.stopping and (o.max_jobs is None or self.claimed + after < o.max_jobs)

    def run_round(self, conn: psycopg.Connection, pending: list[Claim]) -> list[Outcome]:
        """Claim up to ``batch`` jobs (or take `pending`, claimed with the last finish); run them.

        Return their outcomes, in order (none: the queue had nothing claimable); the last one's
        ``claimed`` are the next round's `pending`. An extension point: a subclass may run
        jobs its own way here; the loop around it stays.
        """
        batch = self.options.batch
        claims = pending or self.queue.claim_many(conn, batch, worker=self.name,
                                                  events=self.events)
        outcomes: list[Outcome] = []
        n = len(claims)

        def more() -> int:
            # The last finish claims the next batch in the same commit, unless the worker will
            # stop (asked at the finish: a signal may come during the work).
            return batch if self._goes_on(n) else 0

        if self.options.batch_commit and claims:
            try:
                return self.queue.run_together(conn, claims, claim_next=more)
            finally:
                for c in claims:
                    self.queue.release(c)
        try:
            for i, c in enumerate(claims):
                outcomes.append(self.queue.run_claimed(conn, c,
                                                       claim_next=more if i == n - 1 else 0))
        finally:
            # Cut off mid-batch: the jobs not run yet must not keep fresh leases.
            for c in claims:
                self.queue.release(c)
        return outcomes

    def _listen(self, conn: psycopg.Connection) -> bool:
        conn.execute(q("listen"))
        return True

    def _wait(self, conn: psycopg.Connection, listening: bool) -> None:
        """Wait for a NOTIFY (or the poll's timeout), waking every 50 ms to check for a stop."""
        deadline = time.monotonic() + self.options.poll
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if not listening:
                time.sleep(min(0.05, left))
                continue
            woke = any(True for _ in conn.notifies(timeout=min(0.05, left), stop_after=1))
            if woke:
                # One wake for everything received so far (psycopg keeps what came in while
                # the worker was busy): it all precedes the claim that follows.
                for _ in conn.notifies(timeout=0):
                    pass
                return


    def _sleep(self, seconds: float) -> None:
        """Wait between reconnects, cut short by a stop."""
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.05, seconds))


def stop_on_signals(worker: Any) -> None:
    """Let SIGTERM, SIGINT and SIGHUP stop `worker` after its current job (a second one at once).

    SIGHUP (a closed terminal, a supervisor's reload) would otherwise end the process at once,
    silently, mid-job (exit 129).
    """
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, worker.stop)
