"""Keep the leases of every job a worker holds fresh, from one thread on one connection.

A lease is a guess at the longest job: a job that outlives it is claimed again while it still
runs. A heartbeat replaces the guess, so the worker has one by default: every third of the
lease (``AUTO``). One ``Heartbeats`` per worker process runs
``heartbeat_if_owner_many`` every ``interval`` seconds for all the jobs the worker holds (a
batch claim holds several), which extends each lease by one ``lease``, only for the attempt
this worker claimed. A job leaves the heartbeat when

- its work ends (``release``, before the finish: a beat never races its own completion);
- the fence says its lease was lost (no row back: another attempt owns it) -> ``lease-lost``,
  or an operator cancelled the job -> ``cancelled`` (the handler sees ``claim.cancelled()``);
- its **maximum runtime** is reached (the watchdog, on by default: ``DEFAULT_MAX_RUNTIME``) ->
  ``abandon``, logged at ERROR. A stuck-but-alive worker would otherwise beat forever; after
  the limit the job is failed (``overdue``, a fenced fail on the heartbeat's connection:
  counted, retried after its backoff or dead), another worker may run it, and the fence keeps
  the stuck worker's late writes out.

The connection is opened by ``connect()``, which the worker calls before each claim: a worker
that cannot open its heartbeat's session (the server's or the role's connection limit) claims
nothing, instead of running jobs whose leases nobody extends. It stays open for the worker's
life (a worker holds two sessions: its work and this one).

A beat that wakes up far later than planned means the process was starved: a handler holding
the GIL (a long regex, a C call that does not release it) or a paused process. It is logged at
ERROR with that cause: the leases may have run out meanwhile, and another worker may be running
the same jobs (this worker's finish is then fenced out).

A beat never waits on a row lock (a batch's open transaction may hold one until it commits; two
such waits in opposite orders would deadlock): a locked row is skipped and beaten again soon.

Hazard: a beat that comes too late (a paused process, a lost connection) lets the lease
expire; the fenced finish stays the last defence. Stopping the beat does not stop the work:
Python cannot interrupt a stuck call, which is exactly why the fence is still needed. A lost
connection is logged once and reopened at the next beat; the work carries on meanwhile.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from .jobs import CONNECT, Claim, ConfigError
from .preflight import POOLER_HINT, pooler_error
from .queries import q

APP = (__package__ or "jobqueue").split(".")[0]
log = logging.getLogger(APP)


#: The default heartbeat: a third of the lease, so two beats may be late before it runs out.
AUTO = "auto"
#: The default maximum runtime (the watchdog), in seconds: a job still running after an hour is
#: failed (counted) and its lease no longer extended. ``--max-runtime`` changes it, 0 turns it off.
DEFAULT_MAX_RUNTIME = 3600.0


class Presence:
    """Say a worker is alive and which kinds it serves: its ``jobqueue.workers`` row.

    Written at the start, then at most every third of ``ttl`` (between jobs by the worker, during
    a long job by its heartbeat); a row not refreshed for ``ttl`` seconds is a stopped worker.
    """

    def __init__(self, name: str, kinds: list[str], ttl: float) -> None:
        self.name, self.kinds, self.ttl = name, kinds, ttl
        self.every = ttl / 3
        self.last = -math.inf  # monotonic time of the last write

    def touch(self, conn: psycopg.Connection, *, start: bool = False) -> None:
        """Write the row now (an autocommit connection)."""
        conn.execute(q("worker_seen"), {"name": self.name, "kinds": self.kinds,
                                        "ttl": self.ttl, "start": start})
        self.last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.every

    def gone(self, conn: psycopg.Connection) -> None:
        """Remove the row: this worker stopped."""
        conn.execute(q("worker_gone"), {"name": self.name})


class HeartbeatRefused(psycopg.OperationalError):
    """The heartbeat's session could not be opened (a connection limit, the server going away):
    the worker claims nothing until it can, as in an outage."""


class HeartbeatError(ConfigError):
    """A heartbeat or maximum runtime that cannot work with the lease it is given."""


def runtime_for(interval: float | None, max_runtime: float | str | None) -> float | None:
    """Return the maximum runtime: ``AUTO`` = the default with a heartbeat (none without one:
    the lease alone limits the job then); None = off (the command line's 0 is None here)."""
    if max_runtime == AUTO:
        return DEFAULT_MAX_RUNTIME if interval else None
    if isinstance(max_runtime, str):
        raise HeartbeatError(f"max_runtime must be seconds, {AUTO!r} or None, not {max_runtime!r}")
    return None if max_runtime is None else float(max_runtime)


def interval_for(lease: float, heartbeat: float | str | None) -> float | None:
    """Return the heartbeat's interval: ``AUTO`` = a third of the lease; None or 0 = off."""
    if heartbeat == AUTO:
        return lease / 3
    if isinstance(heartbeat, str):
        raise HeartbeatError(f"heartbeat must be seconds, {AUTO!r} or None, not {heartbeat!r}")
    return float(heartbeat) if heartbeat else None


@dataclass(frozen=True)
class HeartbeatConfig:
    """How often to extend the leases, by how much, and for how long at most.

    ``interval``: seconds between beats; must be shorter than ``lease``, or the lease expires
    between two beats. ``max_runtime``: seconds after the claim at which the job leaves the
    heartbeat and is abandoned (None: beat as long as the work runs).
    """

    lease: float
    interval: float
    max_runtime: float | None = None

    def __post_init__(self) -> None:
        check(self.lease, self.interval, self.max_runtime)


def check(lease: float, interval: float | None, max_runtime: float | None) -> None:
    """Refuse a heartbeat interval or maximum runtime that cannot work; say why."""
    if interval is not None:
        if not 0 < interval < float("inf"):
            raise HeartbeatError(
                f"heartbeat interval must be a positive number of seconds, not {interval!r}")
        if not interval < lease:
            raise HeartbeatError(
                f"heartbeat interval ({interval:g} s) must be shorter than the lease ({lease:g} s): "
                "otherwise the lease expires between two beats and another worker takes the job")
    if max_runtime is not None:
        if not max_runtime > 0:
            raise HeartbeatError(
                f"maximum runtime must be a positive number of seconds, not {max_runtime!r}")
        if interval is None:
            raise HeartbeatError(
                "a maximum runtime needs a heartbeat: it is the moment the heartbeat stops; "
                "without one the lease alone already limits the job")


def dsn_of(conn: psycopg.Connection) -> str:
    """Return a DSN that opens another session like `conn` (same server, database and role)."""
    # info.dsn leaves the password out on purpose; the heartbeat needs it to log in.
    return make_conninfo(conn.info.dsn, password=conn.info.password or None)


@dataclass(eq=False)
class Held:
    """One job in the heartbeat: how many beats extended it, and how it left."""

    claim: Claim
    since: float
    next_beat: float
    deadline: float | None
    beats: int = 0
    lost: bool = False
    abandoned: bool = False
    limit: float | None = None  # its maximum runtime, seconds
    done: threading.Event = field(default_factory=threading.Event)


class Heartbeats:
    """Extend the lease of every held job, from one thread and one connection per worker.

    ``connect()`` before a claim (it opens the connection if it is not open: a refusal raises,
    and nothing is claimed), ``hold(claim)`` at the claim, ``release(claim)`` when its work
    ends; ``close()`` at the end. The thread starts with the first held job and ends after
    ``linger`` seconds with nothing held, closing the connection unless ``keep_open`` (a
    worker's: its second session for its whole life, so a burst is never refused it).
    ``overdue(conn, claim, seconds, limit)``: called on the heartbeat's connection for a job past its
    maximum runtime (the worker fails it there, fenced); None: the job is only let go.
    ``stuck(claim, seconds)``: called (on the heartbeat's thread) when a handler let go at its
    maximum runtime has still not returned ``grace`` seconds later (default: one lease); the
    worker then ends its process so that a supervisor starts a fresh one.
    """

    def __init__(self, dsn: str, config: HeartbeatConfig, *, name: str = "worker",
                 linger: float | None = None, presence: Presence | None = None,
                 overdue: Callable[[psycopg.Connection, Claim, float, float | None], Any]
                 | None = None,
                 stuck: Callable[[Claim, float], Any] | None = None,
                 grace: float | None = None, pooler: bool = False) -> None:
        self.dsn, self.config, self.name = dsn, config, name
        #: Behind a transaction pooler: its connection prepares no statements either.
        self.pooler = pooler
        #: The worker's row, refreshed with the beats while jobs are held (a long job).
        self.presence = presence
        self.overdue, self.stuck = overdue, stuck
        self.grace = config.lease if grace is None else grace
        #: Jobs let go at their maximum runtime whose handler has not returned: when it is too late.
        self._stuck_at: dict[tuple[int, int], tuple[float, Held]] = {}
        self.linger = linger if linger is not None else max(2 * config.interval, 1.0)
        self._held: dict[tuple[int, int], Held] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closing = False
        self._wake_at = math.inf  # when the waiting thread wakes up anyway (inf: not waiting)
        self._conn: psycopg.Connection | None = None
        self._conn_lock = threading.Lock()  # opening or replacing the connection
        self._starved = False  # said once per starvation, not once per late beat
        self.connections = 0  # sessions opened so far (one per worker, one per outage)
        self.keep_open = False

    def connect(self) -> psycopg.Connection:
        """Return the heartbeat's connection, opening it now if needed (raises if refused).

        Called by the worker before it claims: a job whose lease nobody could extend is never
        claimed (a second session refused by a connection limit would otherwise let the lease
        run out under a live job, and the job run again elsewhere).
        """
        with self._conn_lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                try:
                    self._conn = psycopg.connect(self.dsn, autocommit=True, **CONNECT,
                                                 application_name=f"{APP} {self.name} heartbeat",
                                                 **({"prepare_threshold": None} if self.pooler
                                                    else {}))
                except psycopg.OperationalError as e:
                    first = str(e).strip().splitlines()[0] if str(e) else type(e).__name__
                    raise HeartbeatRefused(f"the heartbeat's session (the worker's second) "
                                           f"was refused: {first}") from e
                self.connections += 1
            conn = self._conn
        if not self.keep_open:
            with self._lock:
                self._ensure_thread()  # it lingers, then closes the session
        return conn

    def _ensure_thread(self) -> None:
        """Start the thread if it is not running (the lock held)."""
        if self._thread is None or not self._thread.is_alive():
            self._closing = False
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"{self.name} heartbeat")
            self._thread.start()

    def _drop_connection(self) -> None:
        with self._conn_lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None

    def hold(self, claim: Claim, max_runtime: float | None = None) -> Held:
        """Start extending the claim's lease; its maximum runtime (`max_runtime`, else the
        config's) counts from now."""
        now = time.monotonic()
        c = self.config
        limit = max_runtime if max_runtime is not None else c.max_runtime
        held = Held(claim, now, now + c.interval, now + limit if limit is not None else None,
                    limit=limit)
        with self._lock:
            self._held[(claim.id, claim.attempt)] = held
            if self._thread is None or not self._thread.is_alive():
                self._ensure_thread()
            elif min(held.next_beat, held.deadline or held.next_beat) < self._wake_at:
                # Only when this job needs the thread sooner than it wakes anyway: a worker
                # running short jobs back to back does not wake it once per job.
                self._wake.notify()
        return held

    def release(self, claim: Claim) -> Held | None:
        """Stop extending the claim's lease (its work ended); return what it saw."""
        with self._lock:
            held = self._held.pop((claim.id, claim.attempt), None)
            self._stuck_at.pop((claim.id, claim.attempt), None)
        if held is not None:
            held.done.set()
        return held

    def close(self) -> None:
        """Stop the thread and close its connection (at most one beat's query to wait)."""
        with self._lock:
            self._closing = True
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout=15)
        self._drop_connection()

    def _run(self) -> None:
        failing = False
        idle_since: float | None = None
        while True:
            with self._lock:
                if self._closing:
                    return
                now = time.monotonic()
                if not self._held and not self._stuck_at:
                    idle_since = idle_since or now
                    if now - idle_since >= self.linger:
                        self._thread = None  # the next hold starts a new thread
                        if not self.keep_open:
                            self._drop_connection()
                        return
                    self._sleep(self.linger - (now - idle_since))
                    continue
                idle_since = None
                wake = min([min(h.next_beat, h.deadline or h.next_beat)
                            for h in self._held.values()]
                           + [at for at, _ in self._stuck_at.values()])
                if wake > now:
                    self._sleep(wake - now)
                    continue
                due, overdue = self._due(now)
                stuck = [h for key, (at, h) in list(self._stuck_at.items())
                         if at <= now and self._stuck_at.pop(key)]
            for h in stuck:
                if self.stuck is not None:
                    self.stuck(h.claim, now - h.since)
            if not (due or overdue):
                continue
            try:
                conn = self.connect()
                for h in overdue:
                    self._abandon(conn, h)
                if not due:
                    continue
                began = time.monotonic()
                rows = conn.execute(q("heartbeat_if_owner_many"), {
                    "ids": [h.claim.id for h in due],
                    "attempts": [h.claim.attempt for h in due],
                    "lease": self.config.lease,
                }).fetchall()
                owned = {r[0]: r[1] for r in rows}
                lost = [h.claim.id for h in due if h.claim.id not in owned]
                # Rare: only when a job left this worker. Cancelled, or taken over?
                cancelled = {r[0] for r in conn.execute(
                    q("cancelled_among"), {"ids": lost}).fetchall()} if lost else set()
                if self.presence is not None and self.presence.due():
                    self.presence.touch(conn)
                # Starved while the beat's query ran (its answer waited for the GIL), or a slow
                # server: either way the leases may have run out.
                with self._lock:
                    self._check_starved(time.monotonic() - began, reset=False)
            except psycopg.Error as e:
                if not failing:  # one line per outage, not one per beat
                    log.warning("heartbeat of %s failed, retrying at every beat: %s%s",
                                self.name, e, f" ({POOLER_HINT})" if self._conn is not None
                                and pooler_error(e, self._conn) else "")
                failing = True
                for h in due:
                    h.claim.events.emit("heartbeat-failed", job=h.claim.id,
                                        attempt=h.claim.attempt, error=str(e))
                self._drop_connection()
                self._retry_later(due)
                continue
            if failing:
                log.warning("heartbeat of %s is back", self.name)
                failing = False
            self._record(due, owned, cancelled)

    def _sleep(self, seconds: float) -> None:
        """Wait (the lock held, released while waiting) until woken or `seconds` pass."""
        self._wake_at = planned = time.monotonic() + seconds
        try:
            self._wake.wait(seconds)
        finally:
            self._wake_at = math.inf
        self._check_starved(time.monotonic() - planned)

    def _check_starved(self, late: float, *, reset: bool = True) -> None:
        """Say so (ERROR, once) when this thread woke up so late that the leases may have run
        out: the process was starved (the GIL held by a handler, or the process paused)."""
        c = self.config
        if late < c.lease - c.interval or not self._held:
            if reset:
                self._starved = False
            return
        if self._starved:
            return
        self._starved = True
        jobs = ", ".join(f"{h.claim.id} ({h.claim.kind}, tenant {h.claim.tenant_id})"
                         for h in self._held.values()) or "none"
        log.error("heartbeat of %s was %.1f s late (a beat every %g s, lease %g s): the "
                  "process was starved, most likely by a handler holding the GIL (a long "
                  "regex or a C call that does not release it), a paused process or a server "
                  "that did not answer; the leases "
                  "of jobs %s may have run out and another worker may run them again (their "
                  "finish here is then fenced out). No call in a handler may hold the GIL "
                  "longer than the lease", self.name, late, c.interval, c.lease, jobs)
        for h in self._held.values():
            h.claim.events.emit("heartbeat-starved", job=h.claim.id, attempt=h.claim.attempt,
                                late=late)

    def _due(self, now: float) -> tuple[list[Held], list[Held]]:
        """Return the jobs whose beat is due, and those past their maximum runtime (which leave
        the heartbeat now). Called with the lock held."""
        half = self.config.interval / 2  # beats that fall close together go out together
        due, overdue = [], []
        for key, h in list(self._held.items()):
            if h.deadline is not None and now >= h.deadline:
                del self._held[key]
                h.abandoned = True
                h.done.set()
                overdue.append(h)
                if self.stuck is not None:
                    self._stuck_at[key] = (now + self.grace, h)
            elif h.next_beat <= now + half:
                due.append(h)
        return due, overdue

    def _retry_later(self, due: list[Held]) -> None:
        with self._lock:
            soon = time.monotonic() + min(self.config.interval, 1.0)
            for h in due:
                h.next_beat = soon

    def _record(self, due: list[Held], owned: dict[int, Any],
                cancelled: set[int] | None = None) -> None:
        """Note each due job's beat: extended (owned, new lease), skipped (owned, row locked:
        try again soon), or lost (not owned any more: cancelled, or another attempt's)."""
        with self._lock:
            now = time.monotonic()
            for h in due:
                key = (h.claim.id, h.claim.attempt)
                if self._held.get(key) is not h:
                    continue  # released while the beat ran: its work ended, nothing to say
                if h.claim.id not in owned:
                    del self._held[key]
                    if cancelled and h.claim.id in cancelled:
                        self._cancel(h)
                    else:
                        self._lose(h)
                    continue
                if owned[h.claim.id] is None:
                    # Still ours, but its row is locked by a transaction of this worker's (a
                    # batch's, until it commits): not extended this time.
                    h.next_beat = now + min(self.config.interval / 2, 0.5)
                    continue
                h.beats += 1
                # From now, not from the plan: a late beat must not be followed by a burst.
                h.next_beat = now + self.config.interval
                h.claim.events.emit("heartbeat", job=h.claim.id, attempt=h.claim.attempt,
                                    until=owned[h.claim.id].timestamp())

    def _abandon(self, conn: psycopg.Connection, h: Held) -> None:
        """The watchdog: the job ran past its maximum runtime; its lease is no longer extended.

        Logged at ERROR (job, tenant, runtime); ``overdue`` fails it on this connection (fenced:
        counted, retried after its backoff or dead), so no one waits for its lease to run out.
        Its handler is not interrupted (Python cannot stop a stuck call): its finish is fenced.
        """
        c = h.claim
        runtime = time.monotonic() - h.since
        log.error("job %s (%s, tenant %s) attempt %s still running after %.0f s, past its "
                  "maximum runtime (%g s): the heartbeat stopped extending its lease and the "
                  "attempt is failed; its handler is not interrupted, its finish will be fenced "
                  "out", c.id, c.kind, c.tenant_id, c.attempt, runtime, h.limit)
        c.events.emit("abandon", job=c.id, attempt=c.attempt, max_runtime=h.limit)
        c.cancel_seen = True  # claim.cancelled(): the handler may still return on its own
        if self.overdue is not None:
            self.overdue(conn, c, runtime, h.limit)

    def _cancel(self, h: Held) -> None:
        h.lost = True
        h.claim.cancel_seen = True  # what claim.cancelled() tells the handler
        h.done.set()
        log.info("job %s cancelled while attempt %s runs: heartbeat stopped, its finish will be "
                 "fenced out", h.claim.id, h.claim.attempt)
        h.claim.events.emit("cancelled", job=h.claim.id, attempt=h.claim.attempt)

    def _lose(self, h: Held) -> None:
        h.lost = True
        h.claim.cancel_seen = True  # its finish will be fenced out: the handler may stop now
        h.done.set()
        log.warning("job %s lease lost at attempt %s: heartbeat stopped", h.claim.id, h.claim.attempt)
        h.claim.events.emit("lease-lost", job=h.claim.id, attempt=h.claim.attempt)


class Heartbeat:
    """Beat for one job on a heartbeat of its own: ``with Heartbeat(dsn, claim, config): work()``.

    For scripts and tests; a worker shares one ``Heartbeats`` between all its jobs. After the
    block: ``beats``, ``lost`` (the fence said another attempt owns the job), ``abandoned``.
    """

    def __init__(self, dsn: str, claim: Claim, config: HeartbeatConfig, *,
                 worker: str = "worker", events: Any = None) -> None:
        if events is not None:
            claim.events = events
        self.claim = claim
        self._beats = Heartbeats(dsn, config, name=worker)
        self._held: Held | None = None

    def __enter__(self) -> Heartbeat:
        self._held = self._beats.hold(self.claim)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._beats.release(self.claim)
        self._beats.close()

    @property
    def beats(self) -> int:
        return self._held.beats if self._held else 0

    @property
    def lost(self) -> bool:
        return bool(self._held and self._held.lost)

    @property
    def abandoned(self) -> bool:
        return bool(self._held and self._held.abandoned)
