"""The lab's worker: the production loop (``jobqueue.Worker``) with a design to pick.

``tenantlab worker --design single|leased`` runs it as the ordinary worker role (the command
line is in tenantlab/cli.py; its flags come from ``WorkerConfig``'s fields). It stops cleanly
on SIGTERM/SIGINT after its current job, after ``--max-jobs`` claims, or when the queue is
empty (``--until-empty``). Every event goes to an event log (stdout or a file, one JSON line
each) that experiments draw timelines from.

Without ``--dsn`` (or ``TENANTLAB_DSN``) the worker, ``enqueue`` and ``reap`` share a
playground database, ``tenantlab_playground``, cloned from the template on first use.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from jobqueue import Claim, Leased, Outcome, Worker
from jobqueue.options import WorkerOptions, option, seconds
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import db, kinds, queries, queue, settings
from .events import EventLog
from .queue import Design

log = logging.getLogger("tenantlab")

PLAYGROUND = "tenantlab_playground"
DESIGNS = ["single", "leased"]


def playground_dsn() -> str:
    """Return the playground database's admin DSN; clone it from the template if needed."""
    admin = db.admin_dsn()
    db.ensure_template(admin)
    with db.connect(admin, "playground", autocommit=True) as conn:
        conn.execute(queries.q("playground_lock"))
        try:
            current = db.schema_of(conn, PLAYGROUND)
            if current != queries.schema_version():
                if current is not None:
                    log.warning("the schema changed: recreating %s (its jobs are gone)", PLAYGROUND)
                db.clone_template(conn, PLAYGROUND)
        finally:
            conn.execute(queries.q("playground_unlock"))
    return db.with_db(admin, PLAYGROUND)


def worker_dsn(dsn: str | None = None) -> str:
    """Return a DSN that logs in as the worker role: --dsn, TENANTLAB_DSN, or the playground.

    A DSN for another user (the admin's, say) keeps its host and database but switches to
    tenantlab_worker: workers never run as the owner or a superuser.
    """
    dsn = dsn or settings.dsn() or playground_dsn()
    if conninfo_to_dict(dsn).get("user") == db.WORKER:
        return dsn
    return make_conninfo(dsn, user=db.WORKER, password=db.worker_password(dsn))


@dataclass
class WorkerConfig(WorkerOptions):
    """What one lab worker process does: the production options plus the lab's designs."""

    heartbeat: float | None = option(
        None, "extend the leases every S seconds while jobs run, S < lease (the lab's worker: "
              "off unless given, to show what happens without it)",
        parse=seconds("heartbeat", zero=True))
    design: str = option("leased", "single: one transaction per job; leased: committed claim "
                                   "with a lease", choices=DESIGNS)
    handle_errors: bool = option(False, "single: count a failed attempt in a new transaction")
    fence: bool = option(True, "finish without checking the attempt: the naive lease-only "
                               "queue (leased)", flag="--no-fence")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.design not in DESIGNS:
            raise queue.QueueError(f"design must be 'single' or 'leased', not {self.design!r}")

    def heartbeat_setting(self) -> float | None:
        return self.heartbeat or None  # the lab's worker: off unless given

    def make_design(self) -> queue.SingleTransaction | queue.Leased:
        """Return the queue design these options ask for (refuses what cannot work)."""
        d = queue.design(self.design, lease=self.lease, backoff=self.backoff,
                         handle_errors=self.handle_errors, heartbeat=self.heartbeat,
                         max_runtime=self.max_runtime, fence=self.fence, fair=self.fair,
                         durable_claim=not self.lossy_claim)
        if isinstance(d, queue.SingleTransaction) and self.batch > 1:
            raise queue.QueueError("batch needs the leased design: the single-transaction "
                                   "design claims with its work")
        return d


class LabWorker(Worker):
    """The production loop running a lab design through its public extension point.

    A ``Leased`` design (the production one with the lab's statements) is the production
    worker's own queue. Any other design (the single-transaction queue) runs one job per round
    in ``run_round``, and the worker does not announce itself in ``jobqueue.workers`` (its
    design has no lease for the presence row to ride on).
    """

    def __init__(self, dsn: str, options: WorkerOptions, design: Design, *,
                 events: EventLog | None = None) -> None:
        self.design, self.event_log = design, events
        leased = design if isinstance(design, Leased) else None
        super().__init__(dsn, options, kinds.handlers, queue=leased, events=events)
        if leased is None:
            self.presence = self.queue.presence = None
        # The lab shows what a stuck attempt does after its maximum runtime (it goes on, and
        # the fence keeps its finish out): its worker does not end itself as production's does.
        self.exit_when_stuck = False

    def run_round(self, conn: psycopg.Connection, pending: list[Claim]) -> list[Outcome]:
        if isinstance(self.design, Leased):
            return super().run_round(conn, pending)
        outcome = self.design.run_one(conn, worker=self.name, events=self.event_log)
        return [outcome] if outcome is not None else []


def lab_worker(dsn: str, config: WorkerConfig, events: EventLog) -> Worker:
    """Return the production loop running the design `config` asks for, logging to `events`."""
    return LabWorker(dsn, config, config.make_design(), events=events)
