"""The peers in ``tenantlab bench --peers``: procrastinate and PgQueuer, defaults, no-op jobs.

Each runs on the same server, in a scratch database of its own per round, as the admin (their
schemas need it), with its default settings: procrastinate one job at a time, PgQueuer batches
of 10 run concurrently. Jobs per second = jobs / the wall time of a worker draining the queue
(its start-up included, as for ``workers_1``). Install them with ``pip install -e .[bench]``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from . import db


async def _procrastinate(dsn: str, jobs: int) -> float:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        """Do nothing, as the kit's noop kind."""

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await noop.batch_defer_async(*({} for _ in range(jobs)))
        started = time.perf_counter()
        await app.run_worker_async(wait=False, install_signal_handlers=False)
        return jobs / (time.perf_counter() - started)


async def _pgqueuer(dsn: str, jobs: int) -> float:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        driver = PsycopgDriver(conn)
        queries = Queries(driver)
        await queries.install()
        qm = QueueManager(queries)

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            """Do nothing, as the kit's noop kind."""

        await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
        started = time.perf_counter()
        await qm.run(mode=QueueExecutionMode.drain)
        return jobs / (time.perf_counter() - started)


PEERS: dict[str, Callable[[str, int], Any]] = {"procrastinate": _procrastinate,
                                               "pgqueuer": _pgqueuer}


def run(jobs: int, rounds: int, say: Callable[[str, Any], None]) -> dict[str, list[float]]:
    """Drain `jobs` no-op jobs with each installed peer `rounds` times; return the rates."""
    out: dict[str, list[float]] = {}
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    for name, fn in PEERS.items():
        try:
            __import__(name)
        except ImportError:
            say(name, "not installed: pip install -e .[bench]")
            continue
        for _ in range(rounds):
            with db.scratch(f"bench_{name}") as s:
                rate = asyncio.run(fn(s.admin, jobs))
            out.setdefault(name, []).append(rate)
            say(name, rate)
    return out
