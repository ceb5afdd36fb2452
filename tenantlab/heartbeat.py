"""Keep a claimed attempt's lease fresh while its work runs, up to a maximum runtime.

A lease is a guess at the longest job (finding ``overrun``): a job that outlives it is claimed
again while it still runs. A heartbeat replaces the guess: a thread on a connection of its own
runs ``heartbeat_if_owner`` every ``interval`` seconds, which extends ``locked_until`` by one
lease, only for the attempt this worker claimed. It stops when

- the work ends (the caller leaves the ``with`` block);
- the fence says the lease was lost (the query hit no row: another attempt owns the job);
- the **maximum runtime** is reached: the job is abandoned. A stuck-but-alive worker would
  otherwise beat forever and its job would never be taken over; after the limit its lease runs
  out, another worker may claim the job, and the fence keeps the stuck worker's late writes out.

Hazard: a heartbeat that comes too late (a paused process, a slow network) lets the lease
expire; the fenced finish stays the last defence. Stopping the heartbeat does not stop the work:
Python cannot interrupt a stuck call, which is exactly why the fence is still needed.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import make_conninfo

from . import db
from .events import EventLog, NullLog
from .queries import q

if TYPE_CHECKING:
    from .queue import Claim

log = logging.getLogger("tenantlab")


class HeartbeatError(ValueError):
    """A heartbeat or maximum runtime that cannot work with the lease it is given."""


@dataclass(frozen=True)
class HeartbeatConfig:
    """How often to extend the lease, by how much, and for how long at most.

    ``interval``: seconds between beats; must be shorter than ``lease``, or the lease expires
    between two beats. ``max_runtime``: seconds after the claim at which the heartbeat stops and
    the job is abandoned (None: beat as long as the work runs).
    """

    lease: float
    interval: float
    max_runtime: float | None = None

    def __post_init__(self) -> None:
        check(self.lease, self.interval, self.max_runtime)


def check(lease: float, interval: float | None, max_runtime: float | None) -> None:
    """Refuse a heartbeat interval or maximum runtime that cannot work; say why."""
    if interval is not None:
        if not interval > 0:
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


class Heartbeat:
    """Extend one attempt's lease from a thread: ``with Heartbeat(dsn, claim, config): work()``.

    After the block: ``beats`` (how many extended the lease), ``lost`` (the fence said another
    attempt owns the job), ``abandoned`` (stopped at the maximum runtime).
    """

    def __init__(self, dsn: str, claim: Claim, config: HeartbeatConfig, *, worker: str = "worker",
                 events: EventLog | None = None) -> None:
        self.dsn, self.claim, self.config = dsn, claim, config
        self.worker = worker
        self.events = events or NullLog(worker)
        self.beats = 0
        self.lost = False
        self.abandoned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"heartbeat job {claim.id} attempt {claim.attempt}")

    def __enter__(self) -> Heartbeat:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop beating and wait for the thread (at most one beat's query)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        c, claim = self.config, self.claim
        deadline = self._started + c.max_runtime if c.max_runtime is not None else None
        try:
            with db.connect(self.dsn, f"{self.worker} heartbeat", autocommit=True) as conn:
                next_beat = self._started + c.interval
                while True:
                    wake = next_beat if deadline is None else min(next_beat, deadline)
                    if self._stop.wait(max(0.0, wake - time.monotonic())):
                        return  # the work ended
                    if deadline is not None and time.monotonic() >= deadline:
                        self._abandon()
                        return
                    row = conn.execute(q("heartbeat_if_owner"), {
                        "id": claim.id, "attempt": claim.attempt, "lease": c.lease,
                    }).fetchone()
                    if row is None:
                        self._lose()
                        return
                    self.beats += 1
                    self.events.emit("heartbeat", job=claim.id, attempt=claim.attempt,
                                     until=row[0].timestamp())
                    # From now, not from the plan: a late beat must not be followed by a burst.
                    next_beat = time.monotonic() + c.interval
        except psycopg.Error as e:
            # The work goes on without a heartbeat: its lease will expire, and the fence decides.
            log.warning("heartbeat of job %s attempt %s failed: %s", claim.id, claim.attempt, e)
            self.events.emit("heartbeat-failed", job=claim.id, attempt=claim.attempt, error=str(e))

    def _abandon(self) -> None:
        self.abandoned = True
        log.warning("job %s attempt %s still running after its maximum runtime (%s s): "
                    "heartbeat stopped, the job is abandoned", self.claim.id, self.claim.attempt,
                    self.config.max_runtime)
        self.events.emit("abandon", job=self.claim.id, attempt=self.claim.attempt,
                         max_runtime=self.config.max_runtime)

    def _lose(self) -> None:
        self.lost = True
        log.warning("job %s lease lost at attempt %s: heartbeat stopped",
                    self.claim.id, self.claim.attempt)
        self.events.emit("lease-lost", job=self.claim.id, attempt=self.claim.attempt)
