"""Move jobs whose lease expired out of ``running``: dead when exhausted, else (optionally) queued.

The claim stops taking a job once ``attempts >= max_attempts``, but nothing else changes it:
after its last crash it stays ``running`` with an expired lease forever. The reaper gives it a
final state.

Hazard: the reaper decides by the clock. A worker that is alive but slower than its lease looks
exactly like a dead one; reaping its job fences that worker out (its ``complete_if_owner``
finds the job no longer ``running`` and rolls back), but the work it already did outside the
database happened anyway, and with ``requeue`` another worker will do it again. ``grace`` adds
seconds past the lease before the reaper acts; a heartbeat that keeps live leases fresh is what
actually tells the living from the dead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .jobs import MAX_SECONDS, ConfigError, Events, NullEvents
from .queries import q

APP = (__package__ or "jobqueue").split(".")[0]
log = logging.getLogger(APP)


@dataclass(frozen=True)
class ReaperConfig:
    """How the reaper decides. Defaults: exhausted jobs only, 30 s after their lease ran out."""

    batch: int = 100  # jobs per run_once
    #: Seconds past locked_until before a job counts as abandoned: a live worker whose beat or
    #: finish is late (a pause, a slow commit) is not declared dead at the first instant.
    grace: float = 30.0
    requeue: bool = False  # also put expired jobs with attempts left back to queued
    interval: float = 5.0  # seconds between runs in run_forever

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ConfigError(f"batch must be at least 1, not {self.batch}")
        if not (0 <= self.grace <= MAX_SECONDS and 0 < self.interval <= MAX_SECONDS):
            raise ConfigError(f"grace must be from 0 and interval above 0, both finite seconds "
                              f"up to {MAX_SECONDS:,}")


class Reaper:
    """Give expired leases a final decision, one batch per ``run_once``.

    Jobs whose lease ran out more than ``grace`` seconds ago: dead when their attempts are
    spent, queued again with ``requeue``. Hazard: the reaper decides by the clock. A worker
    that is alive but slower than its lease looks exactly like a dead one; reaping its job
    fences that worker out (its finish no longer matches and rolls back), but the work it
    already did outside the database happened anyway, and with ``requeue`` another worker will
    do it again. The grace covers a late beat; the heartbeat, which keeps live leases fresh, is
    what tells the living from the dead.
    """

    def __init__(self, conn: psycopg.Connection, config: ReaperConfig | None = None,
                 events: Events | None = None) -> None:
        self.conn = conn
        self.config = config or ReaperConfig()
        self.events = events or NullEvents("reaper")

    def run_once(self) -> list[dict[str, Any]]:
        """Reap one batch; return the jobs it changed (id, tenant_id, attempts, status)."""
        c = self.config
        with self.conn.transaction(), self.conn.cursor(row_factory=dict_row) as cur:
            reaped = cur.execute(q("reap_expired"), {
                "grace": c.grace, "requeue": c.requeue, "batch": c.batch,
            }).fetchall()
        reaped.sort(key=lambda r: r["id"])
        for job in reaped:
            # A dead job is an outcome an operator must hear about (at ERROR, as a worker logs
            # one): its lease ran out with its attempts spent. A requeued one is a warning.
            log.log(logging.ERROR if job["status"] == "dead" else logging.WARNING,
                    "reaped job %s (tenant %s) at attempt %s: %s, its lease ran out", job["id"],
                    job.get("tenant_id"), job["attempts"], job["status"])
            self.events.emit("reap", job=job["id"], attempt=job["attempts"], status=job["status"])
        return reaped

    def run_forever(self, stop: Callable[[], bool] | None = None) -> int:
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


def prune(conn: psycopg.Connection, older_than: float, *, batch: int = 1000,
          stop: Callable[[], bool] | None = None) -> dict[str, int]:
    """Delete finished jobs and job_runs rows older than `older_than` seconds, in batches.

    Each batch is its own short transaction (no long lock, no long-held horizon). Returns how
    many rows of each table went.
    """
    if not 0 <= older_than <= MAX_SECONDS or batch < 1:
        raise ConfigError(f"prune needs an age of 0 to {MAX_SECONDS:,} seconds and a batch "
                          "of at least 1")
    gone = {"jobs": 0, "job_runs": 0}
    for table, query in (("jobs", "prune_jobs"), ("job_runs", "prune_runs")):
        while not (stop and stop()):
            with conn.transaction():
                n = len(conn.execute(q(query), {"age": older_than, "batch": batch}).fetchall())
            gone[table] += n
            if n < batch:
                break
    log.info("pruned %s jobs and %s job_runs rows older than %s s",
             gone["jobs"], gone["job_runs"], older_than)
    return gone
