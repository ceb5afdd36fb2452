"""Move jobs whose lease expired out of ``running``: dead when exhausted, else (optionally) queued.

The leased claim stops taking a job once ``attempts >= max_attempts``, but nothing else
changes it: after its last crash it stays ``running`` with an expired lease forever (finding
``crash``). The reaper gives it a final state.

Hazard: the reaper decides by the clock. A worker that is alive but slower than its lease
(finding ``overrun``) looks exactly like a dead one; reaping its job fences that worker out
(its ``complete_if_owner`` finds the job no longer ``running`` and rolls back), but the work it
already did outside the database happened anyway, and with ``requeue`` another worker will do
it again. ``grace`` adds seconds past the lease before the reaper acts; a heartbeat that keeps
live leases fresh is what actually tells the living from the dead.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .events import EventLog, NullLog
from .queries import q

log = logging.getLogger("tenantlab")


@dataclass(frozen=True)
class ReaperConfig:
    """How the reaper decides. Defaults: the article's proposal, exhausted jobs only."""

    batch: int = 100  # jobs per run_once
    grace: float = 0.0  # seconds past locked_until before a job counts as abandoned
    requeue: bool = False  # also put expired jobs with attempts left back to queued
    interval: float = 5.0  # seconds between runs in run_forever

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"batch must be at least 1, not {self.batch}")
        if self.grace < 0 or self.interval <= 0:
            raise ValueError("grace must be >= 0 and interval > 0 seconds")


class Reaper:
    """Give expired leases a final decision, one batch per ``run_once``."""

    def __init__(self, conn: psycopg.Connection, config: ReaperConfig | None = None,
                 events: EventLog | None = None) -> None:
        self.conn = conn
        self.config = config or ReaperConfig()
        self.events = events or NullLog("reaper")

    def run_once(self) -> list[dict[str, Any]]:
        """Reap one batch; return the jobs it changed (id, tenant_id, attempts, status)."""
        c = self.config
        with self.conn.transaction(), self.conn.cursor(row_factory=dict_row) as cur:
            reaped = cur.execute(q("reap_expired"), {
                "grace": c.grace, "requeue": c.requeue, "batch": c.batch,
            }).fetchall()
        for job in reaped:
            log.info("reaped job %s at attempt %s: %s", job["id"], job["attempts"], job["status"])
            self.events.emit("reap", job=job["id"], attempt=job["attempts"], status=job["status"])
        return reaped

    def run_forever(self, stop: Any = None) -> int:
        """Reap every ``interval`` seconds until ``stop()`` is true; return how many were reaped."""
        total = 0
        while not (stop and stop()):
            while batch := self.run_once():  # drain a backlog before sleeping
                total += len(batch)
                if stop and stop():
                    return total
            deadline = time.monotonic() + self.config.interval
            while time.monotonic() < deadline and not (stop and stop()):
                time.sleep(0.05)
        return total
