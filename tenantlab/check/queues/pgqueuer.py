"""PgQueuer as rows of the matrix, on asyncpg (the driver its docs use), each worker run as
``pgq run`` runs it (``pgqueuer.run`` with a factory): ★ its true defaults (no retry,
``heartbeat_timeout`` 30 s, ``dequeue_timeout`` 30 s, batch 10, no limit on concurrent jobs);
``scaled`` the same with ``heartbeat_timeout`` and ``dequeue_timeout`` at the scenario's lease
(a stale job is re-picked only by a dequeue, which an idle worker runs every
``dequeue_timeout``); ``recommended`` what its docs recommend, each setting quoted in
``RECOMMENDED``: the ``DatabaseRetryEntrypointExecutor``, failed jobs held
(``on_failure="hold"``), ``heartbeat_timeout`` the longest job plus a margin,
``dequeue_timeout`` as its reliability guide, and ``restart_on_failure``.

One entrypoint, ``tenantlab_body``; the payload is JSON of the body's kind, tenant and payload.
Blocking work goes through ``asyncio.to_thread`` as its docs say (the ``block`` body); the
``block-loop`` scenario calls it on the loop, against the docs. The body sees
``job.attempts + 1`` (PgQueuer counts previous attempts, and only when a retry is requested: a
job re-picked after a stale heartbeat keeps its count). Behind PgBouncer the asyncpg
connection is made with ``statement_cache_size=0``, as asyncpg's docs say for transaction
pooling. No per-job connection hook (a handler gets the job and a context, no connection): no
tenant-leak scenario.

A job that leaves the queue table (done, or failed with the default ``on_failure="delete"``)
is found in ``pgqueuer_log``, whose last row for it says how it ended.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from ..adapter import Options, Policy, State
from ._peers import LONGEST_JOB, MARGIN, Peer, install_hint, parse, quoted, run, three_rows, url

ENTRYPOINT = "tenantlab_body"
DOCS = "https://janbjorge.github.io/pgqueuer"
ASYNCPG_FAQ = ("https://magicstack.github.io/asyncpg/current/faq.html"
               "#why-am-i-getting-prepared-statement-errors")
#: The defaults: ``pgqueuer.run`` / ``pgq run``.
HEARTBEAT, DEQUEUE, BATCH = 30.0, 30.0, 10
#: The recommended timers: heartbeat_timeout the longest job plus a margin; dequeue_timeout
#: as the reliability guide's example.
REC_HEARTBEAT, REC_DEQUEUE, RESTART_DELAY = LONGEST_JOB + MARGIN, 5.0, 5.0
QUEUED: dict[str, State] = {"queued": "queued", "picked": "running", "failed": "failed"}
LOGGED: dict[str, State] = {"successful": "done", "exception": "failed", "failed": "failed",
                            "canceled": "failed", "deleted": "failed",
                            "queued": "queued", "picked": "running"}


class PgQueuerQueue(Peer):
    """PgQueuer, through its own Queries and QueueManager on an asyncpg connection."""

    def install(self, dsn: str) -> None:
        async def go() -> None:
            async with _connection(dsn, "suite pgqueuer install") as queries:
                await queries.install()
        run(go)

    def enqueue(self, dsn: str, kind: str, tenant: int, payload: dict[str, Any],
                options: Options) -> str:
        body = json.dumps({"kind": kind, "tenant": tenant, "payload": payload}).encode()

        async def go() -> str:
            async with _connection(dsn, "suite pgqueuer enqueue") as queries:
                ids = await queries.enqueue(ENTRYPOINT, body)
            return str(ids[0])
        return run(go)

    def states(self, dsn: str) -> dict[str, State]:
        import psycopg

        from ._peers import tagged

        with psycopg.connect(tagged(dsn, "suite pgqueuer states")) as conn:
            # Last log row per job first, then the live queue table overrides it.
            logged = conn.execute(
                "select distinct on (job_id) job_id, status::text from pgqueuer_log"
                " order by job_id, id desc").fetchall()
            live = conn.execute("select id, status::text from pgqueuer").fetchall()
        out = {str(i): LOGGED.get(s, "running") for i, s in logged}
        out.update({str(i): QUEUED.get(s, "running") for i, s in live})
        return out

    def created(self, dsn: str) -> dict[str, float]:
        """Each job's enqueue on the server's clock (its ``queued`` log row, written by the
        enqueue statement itself)."""
        import psycopg

        from ._peers import tagged

        with psycopg.connect(tagged(dsn, "suite pgqueuer created")) as conn:
            rows = conn.execute("select job_id, extract(epoch from created)::float8"
                                " from pgqueuer_log where status = 'queued'").fetchall()
        return {str(i): float(t) for i, t in rows}


class _connection:
    """An asyncpg connection wrapped in PgQueuer's Queries (closed on exit)."""

    def __init__(self, dsn: str, name: str) -> None:
        self.dsn, self.name, self.conn = dsn, name, None

    async def __aenter__(self) -> Any:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        self.conn = await asyncpg.connect(url(self.dsn, self.name))
        return Queries(AsyncpgDriver(self.conn))

    async def __aexit__(self, *exc: object) -> None:
        if self.conn is not None:
            await self.conn.close()


def timers(setting: str, lease: float) -> tuple[float, float]:
    """(heartbeat_timeout, dequeue_timeout) of a row."""
    if setting == "scaled":
        return lease, lease
    if setting == "recommended":
        return REC_HEARTBEAT, REC_DEQUEUE
    return HEARTBEAT, DEQUEUE


async def worker(args: Any) -> None:
    """Run one PgQueuer worker as ``pgq run`` does, executing the suite's bodies."""
    import contextlib
    from collections.abc import AsyncIterator

    import asyncpg
    import pgqueuer
    from pgqueuer import AsyncpgDriver, DatabaseRetryEntrypointExecutor, Job, PgQueuer

    from .. import bodies

    recommended = args.setting == "recommended"
    options: dict[str, Any] = {}
    if recommended:
        # PgQueuer's max_attempts counts retries (it re-raises once job.attempts reaches it).
        options = {"on_failure": "hold", "executor_factory": lambda p: DatabaseRetryEntrypointExecutor(
            parameters=p, max_attempts=max(args.max_attempts - 1, 0))}
    # Behind PgBouncer in transaction mode: no prepared-statement cache (asyncpg's FAQ).
    connect: dict[str, Any] = {"statement_cache_size": 0} if args.pooler else {}

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[PgQueuer]:
        conn = await asyncpg.connect(url(args.dsn, "check pgqueuer worker"), **connect)
        try:
            pgq = PgQueuer(AsyncpgDriver(conn))

            @pgq.entrypoint(ENTRYPOINT, **options)
            async def body(job: Job) -> None:
                d = json.loads(job.payload or b"{}")
                await bodies.run_async(args.history, d["kind"], job.id, attempt=job.attempts + 1,
                                       tenant=d.get("tenant"), payload=d.get("payload"))

            yield pgq
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    heartbeat, dequeue = timers(args.setting, args.lease)
    await pgqueuer.run(factory, heartbeat_timeout=timedelta(seconds=heartbeat),
                       dequeue_timeout=timedelta(seconds=dequeue), batch_size=BATCH,
                       restart_on_failure=recommended,
                       restart_delay=timedelta(seconds=RESTART_DELAY))


def _policy(setting: str, options: Options) -> Policy:
    """No retry (★, scaled): one execution, a failure final at once; recommended: the executor's
    retries after 1 s, 2 s, ... each seen at the next dequeue. A job re-picked after a stale
    heartbeat is never counted: nothing makes a crashing job final."""
    heartbeat, dequeue = timers(setting, options.lease)
    if setting == "recommended":
        n = options.max_attempts
        final = sum(2.0 ** i for i in range(n - 1)) + n * dequeue
        budget, basis = n, (f"executor max_attempts {n - 1} retries, backoff 1 s doubling, "
                            f"dequeue_timeout {dequeue:g} s; re-picks after heartbeat_timeout "
                            f"{heartbeat:g} s are not counted")
    else:
        final, budget = dequeue, 1
        basis = (f"no retry; re-picks after heartbeat_timeout {heartbeat:g} s (seen within "
                 f"dequeue_timeout {dequeue:g} s) are not counted")
    return Policy(budget=budget, timeout=heartbeat, poison_final=final, crash_final=None,
                  poll=dequeue, basis=basis,
                  concurrency=f"batch {BATCH}, no limit")


RECOMMENDED_QUOTES = {
    "heartbeat_timeout": (f"{DOCS}/guides/heartbeat/",
                          "Set it to match your expected maximum job runtime plus a safety "
                          "margin to avoid prematurely re-queuing legitimately long-running jobs."),
    "dequeue_timeout": (f"{DOCS}/guides/reliability/",
                        "dequeue_timeout=timedelta(seconds=5),"),
    "executor": (f"{DOCS}/guides/reliability/",
                 "Use DatabaseRetryEntrypointExecutor to automatically convert any exception "
                 "into a database-level retry with exponential backoff"),
    "on_failure": (f"{DOCS}/guides/hold-failed-jobs/",
                   "Combine DatabaseRetryEntrypointExecutor with on_failure=\"hold\" to get "
                   "automatic retries and a safety net."),
    "restart_on_failure": (f"{DOCS}/reference/cli/",
                           "With --restart-on-failure, the factory runs again after each "
                           "failure, so every restart gets fresh connections and state."),
    "blocking work": (f"{DOCS}/getting-started/core-concepts/",
                      "If you have blocking code, wrap it with asyncio.to_thread()"),
    "behind PgBouncer": (ASYNCPG_FAQ, "disable automatic use of prepared statements by "
                         "passing statement_cache_size=0 to asyncpg.connect() and "
                         "asyncpg.create_pool()"),
}


class Row(PgQueuerQueue):
    def policy(self, options: Options) -> Policy:
        return _policy(self.setting, options)


def rows() -> list[Peer]:
    hint = install_hint("pgqueuer[asyncpg]==1.6.*")
    promises = ("A failed job is not retried unless a retry is requested (an executor or "
                "RetryRequested); a job whose heartbeat goes stale past heartbeat_timeout is "
                "re-picked by any worker, and will run again from the start.")
    links = {"driver": f"{DOCS}/getting-started/quickstart/",
             "executor": f"{DOCS}/guides/custom-executors/",
             "on_failure": f"{DOCS}/guides/hold-failed-jobs/",
             "heartbeat_timeout": f"{DOCS}/guides/heartbeat/",
             "dequeue_timeout": f"{DOCS}/guides/reliability/",
             "batch_size": f"{DOCS}/guides/performance-tuning/",
             "concurrency": f"{DOCS}/guides/performance-tuning/",
             "restart_on_failure": f"{DOCS}/reference/cli/",
             "blocking work": f"{DOCS}/getting-started/core-concepts/",
             "behind PgBouncer": ASYNCPG_FAQ}
    base = {"driver": "asyncpg (AsyncpgDriver)", "executor": "EntrypointExecutor (no retry)",
            "on_failure": "delete", "heartbeat_timeout": "30 s", "dequeue_timeout": "30 s",
            "batch_size": BATCH, "concurrency": "no limit (max_concurrent_tasks None)",
            "restart_on_failure": "off", "blocking work": "asyncio.to_thread",
            "behind PgBouncer": "statement_cache_size=0"}
    scaled = {**base, "heartbeat_timeout": "the scenario's lease (2 s)",
              "dequeue_timeout": "the scenario's lease (2 s)"}
    values = {"heartbeat_timeout": f"{REC_HEARTBEAT:g} s (the suite's longest job, "
                                   f"{LONGEST_JOB:g} s, plus {MARGIN:g} s)",
              "dequeue_timeout": f"{REC_DEQUEUE:g} s",
              "executor": "DatabaseRetryEntrypointExecutor(max_attempts=max_attempts-1) "
                          "(backoff 1 s, x2)",
              "on_failure": "hold",
              "restart_on_failure": f"on (restart_delay {RESTART_DELAY:g} s)",
              "blocking work": "asyncio.to_thread",
              "behind PgBouncer": "statement_cache_size=0"}
    recommended: dict[str, Any] = {**base, **{k: quoted(v, *RECOMMENDED_QUOTES[k])
                                              for k, v in values.items()}}
    features = frozenset({"attempts", "event-loop", "pgbouncer"})
    return [Row(name="pgqueuer", setting=setting, distribution="pgqueuer", settings=settings,
                links=links, promises=promises, install_hint=hint, features=features)
            for setting, settings in three_rows(base, scaled, recommended)]


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.role != "worker":
        raise SystemExit("pgqueuer has no maintenance process: workers re-pick stale jobs")
    asyncio.run(worker(args))


if __name__ == "__main__":
    main()
