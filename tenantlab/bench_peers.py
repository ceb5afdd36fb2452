"""The peers in ``tenantlab bench --peers``: procrastinate and PgQueuer, defaults, no-op jobs.

Each runs on the same server, in a scratch database of its own per round, as the admin (their
schemas need it), with its default settings: procrastinate one job at a time, PgQueuer batches
of 10 run concurrently (on psycopg, the driver the kit already has). Jobs per second = jobs /
the time from the worker's start to the last job's execution. Install them with
``pip install -e .[bench]``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from . import db


class _Clock:
    """Time a drain from the worker's start to the last job's execution (shut-down left out:
    PgQueuer's drain waits out buffer timeouts before it returns)."""

    def __init__(self, jobs: int) -> None:
        self.jobs, self.seen, self.t0, self.t1 = jobs, 0, 0.0, 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def tick(self) -> None:
        self.seen += 1
        if self.seen == self.jobs:
            self.t1 = time.perf_counter()

    def rate(self) -> float:
        if self.seen < self.jobs:
            raise RuntimeError(f"the peer ran {self.seen} of {self.jobs} jobs")
        return self.jobs / (self.t1 - self.t0)


async def _procrastinate(dsn: str, jobs: int) -> float:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    seen = _Clock(jobs)

    @app.task(name="noop")
    async def noop() -> None:
        """Do nothing, as the kit's noop kind."""
        seen.tick()

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await noop.batch_defer_async(*({} for _ in range(jobs)))
        seen.start()
        await app.run_worker_async(wait=False, install_signal_handlers=False)
        return seen.rate()


async def _pgqueuer(dsn: str, jobs: int) -> float:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        driver = PsycopgDriver(conn)
        queries = Queries(driver)
        await queries.install()
        qm = QueueManager(queries)
        seen = _Clock(jobs)

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            """Do nothing, as the kit's noop kind."""
            seen.tick()

        await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
        seen.start()
        await qm.run(mode=QueueExecutionMode.drain)
        return seen.rate()


PEERS: dict[str, Callable[[str, int], Any]] = {"procrastinate": _procrastinate,
                                               "pgqueuer": _pgqueuer}


def installed(say: Callable[[str, Any], None]) -> list[str]:
    """Return the peers that can be imported here (and say which cannot)."""
    out = []
    for name in PEERS:
        try:
            __import__(name)
        except ImportError:
            say(name, "not installed: pip install -e .[bench]")
            continue
        out.append(name)
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    return out


def drain(name: str, jobs: int) -> float:
    """Drain `jobs` no-op jobs with one peer in a fresh database; return jobs per second."""
    with db.scratch(f"bench_{name}") as s:
        return float(asyncio.run(PEERS[name](s.admin, jobs)))
