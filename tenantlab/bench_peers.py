"""The peers in ``tenantlab bench --peers``: procrastinate, PgQueuer and awa, defaults, no-op jobs.

Each runs on the same server, in a scratch database of its own per round, as the admin (their
schemas need it), with its default settings and its documented driver: procrastinate one job at
a time on psycopg; PgQueuer on asyncpg, batches of 10 run concurrently (``pgqueuer``; on psycopg
as ``pgqueuer_psycopg``); awa (``awa-pg``, the Python SDK of awa's Rust core) with the 10
permits ``start()`` gives a queue by default (``awa``) and with one (``awa_one``). Jobs per
second: from the first job's execution to the last (start-up and shut-down left out). They are in the
dev extra (``pip install -e .[dev]``, ``make test``) and the bench extra.

What each row's finish costs in WAL flushes (read from each library's code, synchronous_commit
left at the server's setting by all three): ``DURABILITY``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import db


class Clock:
    """Time a drain from its first job's execution to its last.

    Start-up (awa's leader election and first poll, PgQueuer's first dequeue, jobqueue's
    preflight) and shut-down (PgQueuer's drain waits out its buffer timeouts, jobqueue's last
    commit) are left out: the rate is each queue's steady state, the same clock for every row
    that runs a worker (``bench.drain`` times jobqueue's with it too), never less than from the
    worker's start.
    """

    def __init__(self, jobs: int) -> None:
        self.jobs, self.seen, self.t0, self.t1 = jobs, 0, 0.0, 0.0
        self.cpu0 = self.cpu1 = 0.0  # the process's CPU time (all threads) at the same two ticks
        self.done = asyncio.Event()

    def start(self) -> None:
        """Mark the worker's start (the clock itself starts at the first job)."""
        self.seen = 0

    def tick(self) -> None:
        self.seen += 1
        if self.seen == 1:
            self.t0, self.cpu0 = time.perf_counter(), time.process_time()
        if self.seen == self.jobs:
            self.t1, self.cpu1 = time.perf_counter(), time.process_time()
            self.done.set()

    def rate(self) -> dict[str, float]:
        """Return jobs per second and the client's CPU ms per job, first job to last."""
        if self.seen < self.jobs:
            raise RuntimeError(f"the peer ran {self.seen} of {self.jobs} jobs")
        # jobs - 1 intervals between the first execution and the last
        n = max(self.jobs - 1, 1)
        return {"jobs_per_s": n / max(self.t1 - self.t0, 1e-9),
                "cpu_ms_per_job": (self.cpu1 - self.cpu0) * 1000 / n}


Rate = dict[str, float]


async def _procrastinate(dsn: str, jobs: int) -> Rate:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    seen = Clock(jobs)

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


async def _pgqueuer_drain(driver: Any, jobs: int) -> Rate:
    from pgqueuer import Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    queries = Queries(driver)
    await queries.install()
    qm = QueueManager(queries)
    seen = Clock(jobs)

    @qm.entrypoint("noop")
    async def noop(job: Any) -> None:
        """Do nothing, as the kit's noop kind."""
        seen.tick()

    await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
    seen.start()
    await qm.run(mode=QueueExecutionMode.drain)
    return seen.rate()


async def _pgqueuer(dsn: str, jobs: int) -> Rate:
    """PgQueuer on asyncpg, the driver its documentation starts with."""
    import asyncpg
    from pgqueuer import AsyncpgDriver

    conn = await asyncpg.connect(_url(dsn))
    try:
        return await _pgqueuer_drain(AsyncpgDriver(conn), jobs)
    finally:
        await conn.close()


async def _pgqueuer_psycopg(dsn: str, jobs: int) -> Rate:
    """PgQueuer on psycopg's async connection (autocommit, as its drivers page asks)."""
    import psycopg
    from pgqueuer import PsycopgDriver

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await _pgqueuer_drain(PsycopgDriver(conn), jobs)


@dataclass
class Noop:
    """awa's job arguments: none (its kind is ``noop``, from the class name)."""


async def _awa(dsn: str, jobs: int, permits: int | None) -> Rate:
    """awa: ``start()`` with no queue list gives each queue 10 permits; ``permits`` sets them."""
    import awa

    client = awa.AsyncClient(_url(dsn))
    try:
        await client.migrate()
        # What start() does on a fresh install (queue storage, awa 0.6's engine), done before
        # the jobs go in so that they are enqueued the fast way (COPY) and not while it runs.
        await client.install_queue_storage()
        seen = Clock(jobs)

        @client.task(Noop)
        async def noop(job: Any) -> None:
            """Do nothing, as the kit's noop kind."""
            seen.tick()

        await client.enqueue_many_copy([Noop() for _ in range(jobs)])
        seen.start()
        await client.start(None if permits is None else [("default", permits)])
        try:
            # awa has no drain mode: wait for the last job, at most a minute per 1,000 jobs.
            await asyncio.wait_for(seen.done.wait(), timeout=60 + jobs * 0.06)
        except TimeoutError:
            pass  # rate() says how many ran
        finally:
            await client.shutdown()
        return seen.rate()
    finally:
        await client.close()


def _url(dsn: str) -> str:
    """Return `dsn` as a postgresql:// URL (awa takes no key=value connection strings)."""
    from urllib.parse import quote, urlencode

    from psycopg.conninfo import conninfo_to_dict

    d = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    user = quote(d.pop("user", ""), safe="")
    password = d.pop("password", None)
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    host, port, name = d.pop("host", ""), d.pop("port", ""), quote(d.pop("dbname", ""), safe="")
    where = quote(host, safe="") if host.startswith("/") else host
    query = f"?{urlencode(d)}" if d else ""
    return f"postgresql://{auth}{where}{':' + port if port else ''}/{name}{query}"


async def _awa_default(dsn: str, jobs: int) -> Rate:
    return await _awa(dsn, jobs, None)


async def _awa_one(dsn: str, jobs: int) -> Rate:
    return await _awa(dsn, jobs, 1)


#: Results key -> (the drain, the module it needs).
PEERS: dict[str, tuple[Callable[[str, int], Any], str]] = {
    "procrastinate": (_procrastinate, "procrastinate"),
    "pgqueuer": (_pgqueuer, "asyncpg"),
    "pgqueuer_psycopg": (_pgqueuer_psycopg, "pgqueuer"),
    "awa": (_awa_default, "awa"),
    "awa_one": (_awa_one, "awa"),
}

#: What a crash right after a job's handler can lose, and what each job's finish costs in WAL
#: flushes (commits with synchronous_commit on), as each library's code does it.
DURABILITY = {
    "procrastinate": "flush per job: fetch_job and finish_job each commit on their own (two "
                     "flushes per job)",
    "pgqueuer": "flush per batch: a dequeue of up to 10 jobs commits once; finishes are "
                "buffered and written (moved to the log) in one statement per 10 jobs or 0.1 s",
    "pgqueuer_psycopg": "flush per batch, as `pgqueuer`",
    "awa": "flush per batch: completions that end within 1 ms share one commit (up to 512); "
           "a claim takes up to the free permits (10) in one commit",
    "awa_one": "flush per job: with one permit each job's claim and its completion commit "
               "apart, beside its own upkeep (heartbeats, lease rotation)",
}

#: The page that documents each peer's driver and the defaults used here.
DOCS = {
    "procrastinate": "https://procrastinate.readthedocs.io/en/stable/howto/production/"
                     "concurrency.html",
    "pgqueuer": "https://github.com/janbjorge/pgqueuer/blob/main/docs/reference/drivers.md",
    "pgqueuer_psycopg": "https://github.com/janbjorge/pgqueuer/blob/main/docs/reference/"
                        "drivers.md",
    "awa": "https://github.com/hardbyte/awa/blob/main/docs/getting-started-python.md",
    "awa_one": "https://github.com/hardbyte/awa/blob/main/docs/configuration.md",
}


def installed(say: Callable[[str, Any], None]) -> list[str]:
    """Return the peers that can be imported here (and say which cannot)."""
    out = []
    for name, (_, module) in PEERS.items():
        try:
            __import__(module)
            if name.startswith("pgqueuer"):
                __import__("pgqueuer")
        except ImportError:
            say(name, "not installed: pip install -e .[bench]")
            continue
        out.append(name)
    for logger in ("procrastinate", "pgqueuer", "awa"):
        logging.getLogger(logger).setLevel(logging.WARNING)
    return out


def drain(name: str, jobs: int, drained: Callable[[], None] | None = None) -> Rate:
    """Drain `jobs` no-op jobs with one peer in a fresh database; return jobs per second (and
    the client's CPU ms per job). `drained` runs once the peer's sessions have ended, before
    its database is dropped (the bench reads the server's counters there: a dropped database's
    statistics go with it)."""
    if jobs < 2:
        raise ValueError("a peer's rate needs at least 2 jobs (first execution to last)")
    with db.scratch(f"bench_{name}") as s:
        rate = dict(asyncio.run(PEERS[name][0](s.admin, jobs)))
        if drained is not None:
            drained()
        return rate
