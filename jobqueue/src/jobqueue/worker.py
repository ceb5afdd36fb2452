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
``--max-outage``. A server not reachable at start, and one that answers but takes no writes (a
hot standby, read-only sessions), are outages too: waited for up to ``--max-outage``, then 3.
``4`` stuck: a handler still ran a lease after its maximum runtime (its attempt failed,
counted), and only a fresh process frees the worker.

Behind a transaction pooler (``pooler``): every connection of the worker (its work, its
heartbeat, its preflight) prepares no statements; it LISTENs only on ``listen_dsn`` (a direct
connection), else polls. Everything it sets in a session is transaction-scoped (the tenant and
``synchronous_commit`` by ``set_config(..., true)``, the migrations' advisory lock by
``pg_advisory_xact_lock``), so a pooled session is safe. Without ``pooler``, the prepared
statements' clash through such a pooler stops the worker (exit 2) with one line saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import random
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from . import migrations
from .handlers import Handlers
from .heartbeat import HeartbeatRefused, Presence
from .hooks import Hooks
from .jobs import Claim, ConfigError, Events, JobQueueError, NullEvents, Outcome, error_text
from .leased import Leased, broken
from .options import WorkerOptions
from .periodic import Periodic, Schedules, bad_schedules
from .periodic import schedules as default_schedules
from .preflight import (
    POOLER_HINT,
    StandbyServer,
    check_writable,
    connect,
    diagnose,
    one_line,
    pooler_error,
    preflight,
    refused_login,
    unreachable,
)
from .queries import q

APP = (__package__ or "jobqueue").split(".")[0]
log = logging.getLogger(APP)

EXIT_STOPPED, EXIT_CRASHED, EXIT_CONFIG, EXIT_SERVER_LOST, EXIT_STUCK = 0, 1, 2, 3, 4

#: Seconds a worker's ``jobqueue.workers`` row lives without a refresh (at least twice the
#: lease): a worker silent for longer counts as stopped.
PRESENCE_TTL = 60.0

#: What "the server is gone" looks like: a restart, a dropped connection, or after a failover a
#: host that is now a read-only standby. The worker reconnects; anything else is a bug.
#: The server ending the session on its side is an outage too: an idle-in-transaction or a
#: transaction timeout (25P03, 25P04, raised as InternalError), an administrator's or a
#: shutdown's termination (class 57P: OperationalError).
LOST = (psycopg.OperationalError, psycopg.InterfaceError, psycopg.errors.ReadOnlySqlTransaction,
        psycopg.errors.IdleInTransactionSessionTimeout, psycopg.errors.TransactionTimeout,
        StandbyServer)
#: A statement that fails this many times in a row on a healthy connection is not a passing
#: trouble: the worker stops (exit 2) with its cause instead of "trying again" for ever.
#: Errors of configuration (a grant revoked, a table or column missing: SQLSTATE class 42)
#: stop it sooner.
MAX_FAILED_ROUNDS, MAX_FAILED_ROUNDS_CONFIG = 30, 3
#: Seconds between a running worker's checks of the schema's version: one migrated past what
#: it knows stops it (exit 2) instead of it claiming by rules it does not know (a worker from
#: before queues would claim from every queue, ignoring priorities).
SCHEMA_CHECK = 10.0


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

    def failed(self, error: BaseException, what: str = "lost the server") -> None:
        """Record a failed connection; wait before the next try, or raise ServerLost."""
        now = time.monotonic()
        if self.since is None:
            self.since, self.tries = now, 0
            self.outages += 1
            until = "for ever" if self.limit is None else f"for up to {self.limit:g} s"
            log.warning("%s %s (%s): reconnecting %s", self.who, what,
                        str(error).strip().splitlines()[0] if str(error) else error, until)
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
                                     max_runtime=o.max_runtime_setting(), lossy_claim=o.lossy_claim,
                                     fair=o.fair, queues=o.queues,
                                     tenant_setting=o.tenant_setting, hooks=hooks)
        self.stopping = False
        self.claimed = 0
        #: End the process (exit 4) when a handler outlives its maximum runtime by a lease:
        #: nothing else frees a thread stuck in a call, and the jobs behind it would never run.
        self.exit_when_stuck = True
        self._thread_id: int | None = None
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
        #: One wake-up per job among the idle workers (None: every idle worker wakes, as behind
        #: a pooler or with --listen-dsn, where the register's session is not the listening one).
        self.wake: Wake | None = None
        #: Whether the last round's last finish also claimed (``claim_next``).
        self._asked = False
        #: Claims of their own (not those riding on a finish), and those that found nothing:
        #: what idle workers' wake-ups cost (logged at the stop, in ``worker-stop``).
        self.claim_rounds = 0
        self.empty_claims = 0
        #: Its optional parts' grants and its schedules were checked (on its first connection).
        self.parts_checked = False

    def stop(self, signum: int | None = None, frame: object = None) -> None:
        """Finish the current job, then stop; a second call stops at once."""
        if self.stopping:
            raise KeyboardInterrupt
        self.stopping = True
        self.events.emit("stop-requested", signal=signum)

    def run(self) -> int:
        """Run until stopped; return how many jobs were claimed.

        Raises ServerLost (the server was away, not reachable since the start, or a standby,
        for longer than ``max_outage``) and ConfigError (no handlers; a failed login, no such
        database, a host name that does not resolve; the schema missing or behind; a grant
        missing; prepared statements clashing through a pooler without ``pooler``).
        """
        if not self.queue.handlers:
            raise ConfigError("no handlers registered: pass --handlers MODULE, a module that "
                              "registers its functions with @handlers.register(KIND)")
        self._preflight()
        self._thread_id = threading.get_ident()
        start = dataclasses.asdict(self.options)
        if start.get("listen_dsn"):  # its password stays out of the events
            start["listen_dsn"] = make_conninfo(start["listen_dsn"], password=None)
        self.events.emit("worker-start", **start)
        pooler = self.options.pooler
        try:
            while not self.stopping:
                conn: psycopg.Connection | None = None
                try:
                    with connect(self.dsn, self.name, pooler=pooler) as conn:
                        # A standby answers, then refuses every write: still an outage.
                        check_writable(conn)
                        with self._wakes(conn) as wakes:
                            self.outage.ok()
                            if self._serve(conn, wakes):
                                break
                except LOST as e:
                    if self.stopping:
                        break
                    if refused_login(e):
                        # Refused, not cut off (the password or the database changed since the
                        # start): reconnecting for ever would never help.
                        raise ConfigError(diagnose(e)) from e
                    self._no_clash(e, conn)
                    self.outage.failed(e)
        finally:
            self.queue.close()
            self.events.emit("worker-stop", claimed=self.claimed, claim_rounds=self.claim_rounds,
                             empty_claims=self.empty_claims)
            log.info("%s: stopped: %d jobs claimed; %d claims of their own, %d found nothing",
                     self.name, self.claimed, self.claim_rounds, self.empty_claims)
        return self.claimed

    def _preflight(self) -> None:
        """Check the DSN, the login, the schema and the grants once; wait for a server that
        cannot be reached yet (started before PostgreSQL, or during a failover) as for any
        outage: up to ``max_outage``, then ServerLost (exit 3). Reached and wrong (a login, a
        database, the schema, a grant) is a ConfigError at once (exit 2)."""
        while not self.stopping:
            try:
                preflight(self.dsn, self.name, pooler=self.options.pooler)
                return
            except ConfigError as e:
                if not unreachable(e):
                    raise
                self.outage.failed(e, "cannot reach the server at start")

    @contextlib.contextmanager
    def _wakes(self, conn: psycopg.Connection) -> Iterator[psycopg.Connection | None]:
        """Yield the connection enqueues' NOTIFYs arrive on: `conn` (LISTEN on it), one of its
        own to ``listen_dsn``, or None (poll only: ``--no-listen``, or a pooler, through which
        a LISTEN is never heard)."""
        o = self.options
        if not o.listen or (o.pooler and o.listen_dsn is None):
            yield None
        elif o.listen_dsn is None:
            self._listen(conn)
            self.wake = Wake(self._serves, conn.info.backend_pid)
            self.queue.on_idle = self.wake.register
            try:
                self.wake.register(conn, announce=True)
                yield conn
            finally:
                self.queue.on_idle = None
                self.wake = None
        else:
            with connect(o.listen_dsn, f"{self.name} listen") as listener:
                self._listen(listener)
                yield listener

    def _no_clash(self, error: BaseException, conn: psycopg.Connection | None) -> None:
        """Raise ConfigError (one line: use --pooler) when `error` is psycopg's prepared
        statements clashing through a transaction pooler; trying again would not help."""
        if conn is not None and pooler_error(error, conn):
            raise ConfigError(f"{self.name}: {one_line(error)}: {POOLER_HINT}") from error

    def _serve(self, conn: psycopg.Connection, wakes: psycopg.Connection | None = None) -> bool:
        """Run jobs on one connection (NOTIFYs on `wakes`, if any); True when the worker is
        done (not merely cut off)."""
        if not self.parts_checked:
            self._check_parts(conn)  # the first connection: before any claim
            self.parts_checked = True
        if self.queue.beat is not None:
            # Both sessions before any claim: a worker that cannot open its heartbeat's (a
            # connection limit) waits as in an outage instead of running unleased jobs.
            beats = self.queue.heartbeats(conn)
            beats.keep_open = True
            if self.exit_when_stuck:
                beats.stuck = self._stuck
            beats.connect()
        presence = self.presence
        if presence is not None:
            presence.touch(conn, start=presence.last == -math.inf)
        pending: list[Claim] = []
        try:
            return self._serve_rounds(conn, wakes, pending)
        finally:
            # Cut off between rounds (an outage, a stop): the jobs claimed with the last finish
            # and not run yet are let go. Held, the heartbeat (its session of its own, back
            # with the server) would extend their leases for ever: running for no one.
            for c in pending:
                self.queue.release(c)

    def _serve_rounds(self, conn: psycopg.Connection, wakes: psycopg.Connection | None,
                      pending: list[Claim]) -> bool:
        """The rounds of ``_serve``; `pending` (claimed with the last finish, not run yet) is
        kept up to date in place, for the caller to let go if the rounds end early."""
        o = self.options
        listening = wakes is not None
        presence = self.presence
        idle = False
        failed = 0  # rounds in a row that failed on a healthy connection
        checked = time.monotonic()  # the preflight (or the last round) checked the schema
        # Jobs already claimed (with the last finish) are part of the current job: run them
        # even when a stop was asked for meanwhile.
        while pending or not self.stopping:
            if presence is not None and presence.due():
                presence.touch(conn)
            try:
                if time.monotonic() - checked > SCHEMA_CHECK:
                    self._check_schema(conn)
                    checked = time.monotonic()
                if len(self.schedules):
                    self._tick(conn, holding=bool(pending))
                outcomes = self.run_round(conn, list(pending))
            except psycopg.Error as e:
                self._no_clash(e, conn)
                if broken(conn) or isinstance(e, (psycopg.errors.ReadOnlySqlTransaction,
                                                  HeartbeatRefused)):
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
                for c in pending:
                    # Never run now: its heartbeat must not keep it `running` for ever.
                    self.queue.release(c)
                pending.clear()
                self._sleep(1.0)
                continue
            failed = 0
            act = True
            if listening and outcomes:
                # Busy, the worker never waits for a NOTIFY: psycopg would keep every one that
                # came in meanwhile (memory growing with the enqueues). Read here (counted, see
                # Wake) and dropped: the next claim looks at the table anyway.
                act = self._read(wakes, 0)  # type: ignore[arg-type]
            pending[:] = outcomes[-1].claimed if outcomes else []
            if (self.wake is not None and outcomes and not pending and not act
                    and not o.until_empty and self._asked and outcomes[-1].status == "done"
                    and not self._walks_known_tenants):
                # The last finish's claim found nothing and no wake-up since is this worker's
                # to answer (another idle worker is named for them): idle at once, no claim.
                self.claimed += len(outcomes)
                if o.max_jobs is not None and self.claimed >= o.max_jobs:
                    return self._done(conn)
                self.events.emit("idle")
                idle = True
                self._wait(wakes or conn, listening)
                continue
            if not outcomes:
                if o.until_empty:
                    return self._done(conn)
                if not idle:
                    self.events.emit("idle")
                    idle = True
                self._wait(wakes or conn, listening)
                continue
            idle = False
            self.claimed += len(outcomes)
            if o.max_jobs is not None and self.claimed >= o.max_jobs and not pending:
                return self._done(conn)
        return self._done(conn)

    def _tick(self, conn: psycopg.Connection, *, holding: bool) -> None:
        """Enqueue the periodic jobs whose slot has come.

        With jobs in hand (claimed with the last finish, their leases kept by the heartbeat), a
        failing check does not drop them: it is logged and they run; it counts (and stops the
        worker if it persists) on a round that holds nothing.
        """
        try:
            self.periodic.tick(conn)  # a clock comparison unless a slot may have come
        except psycopg.Error as e:
            if broken(conn) or not holding:
                raise
            log.warning("%s: periodic jobs: %s; the jobs already claimed run first",
                        self.name, error_text(e))

    def _check_parts(self, conn: psycopg.Connection) -> None:
        """Check what this worker uses beyond every worker's needs, at its start: the grants of
        its periodic jobs and of ``--fair round-robin`` (ConfigError), and its schedules (one
        the database would refuse is skipped, logged at ERROR: the worker runs the rest)."""
        uses = ("periodic",) * bool(len(self.schedules)) + \
            ("round-robin",) * (self.options.fair == "round-robin")
        if uses:
            migrations.check_grants(conn, uses, parts_only=True)
        for name, why in bad_schedules(conn, self.schedules).items():
            self.periodic.skip(name, why)

    def _check_schema(self, conn: psycopg.Connection) -> None:
        """Stop (ConfigError) on a schema migrated past what this worker knows."""
        version = migrations.version_now(conn)
        if version is not None and version > migrations.latest():
            raise ConfigError(f"{self.name}: {migrations.newer(conn.info.dbname, version)}")

    def _stuck(self, claim: Claim, seconds: float) -> None:
        """A handler still runs a lease after its maximum runtime: say where, end the process.

        Its attempt is already failed (counted) and fenced; only a fresh process frees the
        worker. Called on the heartbeat's thread; ``os._exit``: the stuck thread never resumes.
        """
        frame = sys._current_frames().get(self._thread_id or -1)
        where = "".join(traceback.format_stack(frame)) if frame is not None else "(unknown)\n"
        log.error("%s: the handler of job %s (%s, tenant %s) attempt %s still runs %.0f s after "
                  "its claim, past its maximum runtime: the worker ends (exit %d) so that its "
                  "supervisor starts a fresh one; the handler is stuck here:\n%s", self.name,
                  claim.id, claim.kind, claim.tenant_id, claim.attempt, seconds, EXIT_STUCK,
                  where.rstrip())
        self.events.emit("stuck-exit", job=claim.id, attempt=claim.attempt, seconds=seconds)
        for handler in logging.getLogger().handlers + log.handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(EXIT_STUCK)

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
        self._asked = False
        if pending:
            claims = pending
        elif self.wake is not None and self.wake.registered:
            claims = self.wake.claim(conn, lambda: self.queue.claim_many(
                conn, batch, worker=self.name, events=self.events), self.queue)
        else:
            claims = self.queue.claim_many(conn, batch, worker=self.name, events=self.events)
        if not pending:
            self.claim_rounds += 1
            self.empty_claims += not claims
        outcomes: list[Outcome] = []
        n = len(claims)

        def more() -> int:
            # The last finish claims the next batch in the same commit, unless the worker will
            # stop (asked at the finish: a signal may come during the work).
            asked = batch if self._goes_on(n) else 0
            self._asked = bool(asked)
            return asked

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

    @property
    def _walks_known_tenants(self) -> bool:
        """Round-robin: a claim riding on a finish walks the tenants this worker knows, so its
        finding nothing does not mean the queue has nothing (a claim of its own lists them all)."""
        fair = getattr(self.queue, "fair", None)
        return fair is not None and fair.policy == "round-robin"

    @property
    def _serves(self) -> str:
        """What this worker serves, its wake-ups' group: its queues and kinds."""
        return ",".join(self.queue.queues) + ";" + ",".join(self.queue.kinds())

    def _wait(self, conn: psycopg.Connection, listening: bool) -> None:
        """Wait for a NOTIFY (or the poll's timeout), waking every 50 ms to check for a stop.

        With ``wake``, only the wake-ups this worker is named for end the wait (Wake).
        """
        if self.wake is not None and not self.wake.registered:
            self.wake.register(conn)  # idle after a failure, a batch: its own transaction
        deadline = time.monotonic() + self.options.poll
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if not listening:
                time.sleep(min(0.05, left))
                continue
            if self._read(conn, min(0.05, left)):
                # One wake for everything received so far (psycopg keeps what came in while
                # the worker was busy): it all precedes the claim that follows.
                self._read(conn, 0)
                return

    def _read(self, conn: psycopg.Connection, timeout: float) -> bool:
        """Read the notifications that came (waiting up to `timeout` for one); True when one
        is this worker's to answer with a claim (any, without ``wake``)."""
        # stop_after=1 ends after the batch that holds the first one: none is lost.
        got = list(conn.notifies(timeout=timeout, stop_after=1))
        if self.wake is None:
            return bool(got)
        act = False
        for n in got:
            act = self.wake.note(n.payload) or act
        return act


    def _sleep(self, seconds: float) -> None:
        """Wait between reconnects, cut short by a stop."""
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.05, seconds))


class Wake:
    """One wake-up per job, not one per idle worker: who of the idle workers answers an enqueue.

    Every idle worker listens on the enqueues' channel, and holds a session advisory lock that
    says it is idle (``idle_register``: keyed by what it serves and its backend pid, taken
    without waiting: nothing holds a snapshot while idle). An enqueue's NOTIFY reaches them all,
    but only the one named last (the designee) claims; the others do nothing (no transaction).
    The designee's claim, when it takes jobs, frees its lock and names another idle worker of
    its group in the same transaction (``idle_hand_on``: one at random from pg_locks, its pid in
    the payload), which every idle worker reads. Claimable jobs remain (a burst): it names none
    and every idle worker claims at once. Otherwise the one named claims at once only when a
    wake-up came that the claim may not have seen: the payload says how many wake-ups the claim
    had read, and every worker counts them since the last naming. No designee known (a new
    session, none idle at the hand-on, a burst: 0): every idle worker claims on a wake-up, as
    before; the first that takes a job names the next. A designee that died (its session ended)
    or was busy when named: the wake-ups wait for the next poll (``--poll``), whose claim finds
    the job and names again.
    """

    def __init__(self, serves: str, pid: int) -> None:
        self.serves, self.pid = serves, pid
        self.key: int | None = None
        #: Whether this session holds its idle lock (client-side: taken once, freed once).
        self.registered = False
        #: The pid named last in this group (None: unknown or none).
        self.designee: int | None = None
        #: The wake-ups read since that naming (None: not counted since then).
        self.since: int | None = None

    def register(self, conn: psycopg.Connection, *, announce: bool = False) -> None:
        """Say this worker is idle (in the caller's transaction, if any); `announce`: name
        itself the designee too (a new session)."""
        if self.registered:
            return
        row = conn.execute(q("idle_register"), {"serves": self.serves,
                                                "announce": announce}).fetchone()
        assert row is not None
        self.key, self.registered = int(row[0]), bool(row[1])

    def note(self, payload: str) -> bool:
        """Count one notification; True when it is this worker's to answer with a claim."""
        if payload.startswith("next "):
            try:
                key, pid, seen, remain = (int(x) for x in payload.split()[1:5])
            except ValueError:
                return False
            if key != self.key:
                return False  # another group's naming
            counted, self.since = self.since, 0
            self.designee = pid or None
            if not pid:
                # Jobs remain and no one is named: every idle worker claims (a burst).
                return bool(remain)
            # seen -1: a worker named itself at its start (its first claim follows).
            return pid == self.pid and seen >= 0 and (counted is None or counted > seen)
        # An enqueue (or any other wake-up): for the designee, or everyone when none is known.
        if self.since is not None:
            self.since += 1
        return self.designee is None or self.designee == self.pid

    def claim(self, conn: psycopg.Connection, claim: Callable[[], list[Claim]],
              queue: Any) -> list[Claim]:
        """Claim as an idle worker: when jobs come, hand the wake-ups on in the same commit."""
        seen = self.since or 0  # what this claim sees, at least
        claims: list[Claim] = []
        try:
            with conn.transaction():
                claims = claim()
                if claims:
                    conn.execute(q("idle_hand_on"), {
                        "serves": self.serves, "seen": seen, "queues": list(queue.queues),
                        "kinds": list(queue.kinds())})
        except BaseException:
            for c in claims:  # rolled back: never this worker's
                queue.release(c)
            raise
        if claims:
            self.registered = False
        return claims


def stop_on_signals(worker: Any) -> None:
    """Let SIGTERM, SIGINT and SIGHUP stop `worker` after its current job (a second one at once).

    SIGHUP (a closed terminal, a supervisor's reload) would otherwise end the process at once,
    silently, mid-job (exit 129).
    """
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, worker.stop)
