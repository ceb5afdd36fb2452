"""The kit's corrected worker (the ``jobqueue`` distribution) as checked rows: ★ and scaled.

Installed as an application installs it: ``jobqueue migrate`` on the trial's database (the
lab's tables in the schema jobqueue dropped first), the README's grants for the worker role.
★ is its true defaults: lease 30 s, the heartbeat every third of the lease, fenced start and
finish, backoff 1 s doubling (jitter 0.75..1.25), polls every 0.5 s, and the reaper at its
defaults (grace 30 s past the lease, a run every 5 s). ``scaled`` sets the lease and the
reaper's grace to the scenario's lease (2 s), as every queue's scaled row does with its own
timers, and runs the reaper every second. Behind PgBouncer in transaction mode (the pgbouncer
scenario) its workers run with ``--pooler``, as its README says for a transaction pooler: no
prepared statements, and wake-ups by the poll (the suite gives a worker only the pooler's DSN,
so there is no direct ``--listen-dsn``). Its worker process is ``python -m jobqueue worker``
with this module's handlers, which run the suite's bodies: ``python -m
tenantlab.check.queues.jobqueue --dsn DSN --history FILE [worker flags]``.
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
from ..adapter import Adapter, Options, Policy
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


#: The defaults this row's ★ runs (Leased, WorkerOptions and ReaperConfig defaults).
LEASE, POLL, BACKOFF, GRACE, REAP_EVERY = 30.0, 0.5, 1.0, 30.0, 5.0

DEFAULT_SETTINGS: dict[str, Any] = {
    "lease": "30 s (default)", "heartbeat": "a third of the lease (default)",
    "backoff": "1 s, doubling, jitter 0.75..1.25 (default)", "poll": "0.5 s (default)",
    "fence": "on (always)", "reaper": "reap --loop 5 (default grace 30 s past the lease)",
    "behind PgBouncer": "--pooler (no prepared statements; wake-ups by the poll)"}
SCALED_SETTINGS: dict[str, Any] = {
    **DEFAULT_SETTINGS, "lease": "the scenario's lease (2 s)",
    "reaper": "reap --loop 1 --grace <lease> (grace scaled to the lease)"}


@dataclass
class JobQueue(_kit.KitRow):
    name: str = "jobqueue"
    settings: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SETTINGS))
    links: dict[str, str] = field(default_factory=lambda: {
        "heartbeat": "notebooks/05-lease-overrun.ipynb",
        "reaper": "notebooks/04-worker-crash.ipynb"})
    promises: str = ("every attempt counted before work; a job runs again only after a fault; "
                     "a late finish is fenced out; exhausted jobs are reaped dead")

    def install(self, dsn: str) -> None:
        """``jobqueue migrate`` as the owner role, on the product's schema alone."""
        db.install_product(dsn)

    def _timers(self, options: Options) -> tuple[float, float, float]:
        """(lease, reaper grace, reaper interval) of this row."""
        if self.setting == "scaled":
            return options.lease, options.lease, 1.0
        return LEASE, GRACE, REAP_EVERY

    def worker_command(self, dsn: str, history: str, options: Options) -> list[str]:
        lease, _, _ = self._timers(options)
        # Behind a transaction pooler, as jobqueue/README.md says: --pooler.
        pooler = ["--pooler"] if options.extra.get("pooler") else []
        return _kit.python(MODULE, dsn, history, "--lease", f"{lease:g}", "--poll", f"{POLL:g}",
                           *pooler)

    def maintenance_command(self, dsn: str, options: Options) -> list[str] | None:
        _, grace, every = self._timers(options)
        return [sys.executable, "-m", "jobqueue", "reap", "--dsn", worker_dsn(dsn),
                "--loop", f"{every:g}", "--grace", f"{grace:g}"]

    def policy(self, options: Options) -> Policy:
        """max_attempts executions; a poison job retried after 1 s, 2 s, ... (at most x1.25),
        each retry seen within a poll; a crashed attempt re-claimed once its lease runs out,
        the last one reaped dead grace + one reaper interval after its lease."""
        lease, grace, every = self._timers(options)
        n = options.max_attempts
        retries = sum(BACKOFF * 2 ** i * 1.25 for i in range(n - 1))
        return Policy(budget=n, timeout=lease, poison_final=retries + n * POLL,
                      crash_final=n * (lease + POLL) + grace + every, poll=POLL,
                      basis=f"max_attempts {n}, lease {lease:g} s, backoff 1 s doubling, "
                            f"reaper grace {grace:g} s every {every:g} s")


def rows() -> list[Adapter]:
    return [JobQueue(), JobQueue(setting="scaled", settings=dict(SCALED_SETTINGS))]


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
