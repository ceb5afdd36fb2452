"""The kit's corrected worker (the ``jobqueue`` distribution) with its defaults, as a checked row.

Installed as an application installs it: ``jobqueue migrate`` on the trial's database (the
lab's tables in the schema jobqueue dropped first), the README's grants for the worker role.
The scenario's lease (2 s) replaces the default 30 s; everything else is the default: the
heartbeat every third of the lease, fenced start and finish, backoff, and the reaper every
second with its grace equal to the lease (the defaults are 30 s and 30 s). Its worker process is
``python -m jobqueue worker`` with this module's handlers, which run the suite's
bodies: ``python -m tenantlab.check.queues.jobqueue --dsn DSN --history FILE [worker flags]``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

import psycopg
from jobqueue import Claim, Handlers
from jobqueue import cli as jobqueue_cli

from ... import db
from ...worker import worker_dsn
from .. import bodies
from ..adapter import Adapter, Options
from . import _kit

#: The history file, set by main() on this module as imported by name (it runs as __main__, and
#: the worker imports it again by name for its handlers, in the same process).
history: str | None = None
handlers = Handlers()
MODULE = "tenantlab.check.queues.jobqueue"


def _body(conn: psycopg.Connection, job: Claim) -> None:
    if history is None:
        raise RuntimeError("the suite's history file is not set: run this module's main()")
    _kit.work(history, conn, job)


for _kind in bodies.KINDS:
    handlers.add(_kind, _body)


@dataclass
class JobQueue(_kit.KitRow):
    name: str = "jobqueue"
    settings: dict[str, Any] = field(default_factory=lambda: {
        "lease": "the scenario's (2 s; default 30 s)", "heartbeat": "a third of the lease (default)",
        "fence": "on (always)", "reaper": "reap --loop 1 --grace <lease> (default grace = lease)"})
    links: dict[str, str] = field(default_factory=lambda: {
        "heartbeat": "notebooks/05-lease-overrun.ipynb",
        "reaper": "notebooks/04-worker-crash.ipynb"})
    promises: str = ("every attempt counted before work; a job runs again only after a fault; "
                     "a late finish is fenced out; exhausted jobs are reaped dead")

    def install(self, dsn: str) -> None:
        """``jobqueue migrate`` as the owner role, on the product's schema alone."""
        db.install_product(dsn)

    def worker_command(self, dsn: str, history: str, options: Options) -> list[str]:
        return _kit.python(MODULE, dsn, history, "--lease", str(options.lease),
                           "--poll", str(options.poll))

    def maintenance_command(self, dsn: str, options: Options) -> list[str] | None:
        return [sys.executable, "-m", "jobqueue", "reap", "--dsn", worker_dsn(dsn),
                "--loop", "1", "--grace", str(options.lease)]


def rows() -> list[Adapter]:
    return [JobQueue()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {__name__}")
    p.add_argument("--dsn", required=True)
    p.add_argument("--history", required=True)
    args, rest = p.parse_known_args(argv)
    from tenantlab.check.queues import jobqueue as by_name  # the module the worker imports

    by_name.history = args.history
    return jobqueue_cli.main(["worker", "--dsn", args.dsn, "--handlers", f"{MODULE}:handlers",
                              *rest])


if __name__ == "__main__":
    raise SystemExit(main())
