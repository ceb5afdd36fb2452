"""The kit's single-transaction queue (``tenantlab.queue.SingleTransaction``) as a checked row.

Claim ``FOR UPDATE SKIP LOCKED``, set the tenant locally, work, finish: one transaction. Its
worker process is the production loop (reconnects, LISTEN) with this design, running the
suite's bodies: ``python -m tenantlab.check.queues.naive --dsn DSN --history FILE``.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field
from typing import Any

import psycopg
from jobqueue import Outcome, WorkerOptions, stop_on_signals

from ...queue import SingleTransaction
from ...worker import LabWorker
from ..adapter import Adapter, Options, Policy
from . import _kit


class Bodies(SingleTransaction):
    """The single-transaction design whose work is the suite's body."""

    def __init__(self, history: str) -> None:
        super().__init__()
        self.history = history

    def run_one(self, conn: psycopg.Connection, work: Any = None, **kw: Any) -> Outcome | None:
        return super().run_one(conn, functools.partial(_kit.work, self.history), **kw)


@dataclass
class Naive(_kit.KitRow):
    name: str = "naive"
    settings: dict[str, Any] = field(default_factory=lambda: {
        "design": "SingleTransaction()", "error handler": "none (the design's default)"})
    links: dict[str, str] = field(default_factory=lambda: {
        "design": "notebooks/03-poison-pill.ipynb"})
    promises: str = ("the row lock is the claim: a job runs once at a time; "
                     "a failure rolls back with the work")

    def worker_command(self, dsn: str, history: str, options: Options) -> list[str]:
        return _kit.python("tenantlab.check.queues.naive", dsn, history, "--poll", str(options.poll))

    def policy(self, options: Options) -> Policy:
        """No budget: the count rolls back with the failed work, so nothing ends a failing or
        crashing job; the row lock is the claim, so no takeover."""
        return Policy(budget=None, timeout=None, poison_final=None, crash_final=None,
                      poll=options.poll, basis="no error handler: an attempt's count rolls back "
                      "with its work")


def rows() -> list[Adapter]:
    return [Naive()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {__name__}")
    p.add_argument("--dsn", required=True)
    p.add_argument("--history", required=True)
    p.add_argument("--poll", type=float, default=0.2)
    args = p.parse_args(argv)
    worker = LabWorker(args.dsn, WorkerOptions(poll=args.poll), Bodies(args.history))
    stop_on_signals(worker)
    worker.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
