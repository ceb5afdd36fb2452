"""PgQueuer as a row of the matrix, on asyncpg (the driver its docs use): its defaults (★), and
what its docs recommend for reliability (the ``DatabaseRetryEntrypointExecutor``, failed jobs
held with ``on_failure="hold"``, and ``heartbeat_timeout`` set to the job's expected runtime,
with the ``dequeue_timeout`` its reliability guide sets beside it: a stale job is re-picked
only by a dequeue, which an idle worker runs every ``dequeue_timeout``).

One entrypoint, ``tenantlab_body``; the payload is JSON of the body's kind, tenant and payload.
The body sees ``job.attempts + 1`` (PgQueuer counts previous attempts, and only when a retry is
requested: a job re-picked after a stale heartbeat keeps its count). PgQueuer has no per-job
maximum of attempts (the executor's ``max_attempts`` decides) and no per-job connection hook
(a handler gets the job and a context, no connection): no tenant-leak scenario.

A job that leaves the queue table (done, or failed with the default ``on_failure="delete"``)
is found in ``pgqueuer_log``, whose last row for it says how it ended.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from ..adapter import Options, State
from ._peers import Peer, install_hint, parse, run, url

ENTRYPOINT = "tenantlab_body"
DOCS = "https://janbjorge.github.io/pgqueuer"
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


async def worker(args: Any) -> None:
    """Run one PgQueuer worker (QueueManager) that executes the suite's bodies."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, DatabaseRetryEntrypointExecutor, Job, PgQueuer

    from .. import bodies

    conn = await asyncpg.connect(url(args.dsn, "check pgqueuer worker"))
    pgq = PgQueuer(AsyncpgDriver(conn))
    recommended = args.setting == "recommended"
    options: dict[str, Any] = {}
    if recommended:
        # PgQueuer's max_attempts counts retries (it re-raises once job.attempts reaches it).
        options = {"on_failure": "hold", "executor_factory": lambda p: DatabaseRetryEntrypointExecutor(
            parameters=p, max_attempts=max(args.max_attempts - 1, 0))}

    @pgq.entrypoint(ENTRYPOINT, **options)
    async def body(job: Job) -> None:
        d = json.loads(job.payload or b"{}")
        await bodies.run_async(args.history, d["kind"], job.id, attempt=job.attempts + 1,
                               tenant=d.get("tenant"), payload=d.get("payload"))

    run_options: dict[str, Any] = {}
    if recommended:
        # A stale job is re-picked only by a dequeue, and an idle worker dequeues on a NOTIFY
        # or every dequeue_timeout (30 s): without it, heartbeat_timeout alone changes nothing
        # (measured: re-picks 31 s apart with heartbeat_timeout = 2 s).
        run_options = {"heartbeat_timeout": timedelta(seconds=args.lease),
                       "dequeue_timeout": timedelta(seconds=args.lease)}
    await pgq.run(**run_options)


def rows() -> list[Peer]:
    hint = install_hint("pgqueuer[asyncpg]==1.6.*")
    promises = ("A failed job is not retried unless a retry is requested (an executor or "
                "RetryRequested); a job whose heartbeat goes stale past heartbeat_timeout is "
                "re-picked by any worker, and will run again from the start.")
    links = {"driver": f"{DOCS}/getting-started/quickstart/",
             "executor": f"{DOCS}/guides/custom-executors/",
             "on_failure": f"{DOCS}/guides/hold-failed-jobs/",
             "heartbeat_timeout": f"{DOCS}/guides/heartbeat/",
             "dequeue_timeout": f"{DOCS}/guides/reliability/#worker-crash-recovery-stalled-jobs",
             "batch_size": f"{DOCS}/guides/performance-tuning/"}
    return [
        PgQueuerQueue(
            name="pgqueuer", setting="default", distribution="pgqueuer",
            settings={"driver": "asyncpg (AsyncpgDriver)", "executor": "EntrypointExecutor "
                      "(no retry)", "on_failure": "delete", "heartbeat_timeout": "30 s",
                      "dequeue_timeout": "30 s", "batch_size": 10},
            links=links, promises=promises, install_hint=hint),
        PgQueuerQueue(
            name="pgqueuer", setting="recommended", distribution="pgqueuer",
            settings={"driver": "asyncpg (AsyncpgDriver)",
                      "executor": "DatabaseRetryEntrypointExecutor(max_attempts=max_attempts-1)"
                                  " (backoff 1 s, x2)",
                      "on_failure": "hold", "heartbeat_timeout": "lease",
                      "dequeue_timeout": "lease", "batch_size": 10},
            links=links, promises=promises, install_hint=hint),
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.role != "worker":
        raise SystemExit("pgqueuer has no maintenance process: workers re-pick stale jobs")
    asyncio.run(worker(args))


if __name__ == "__main__":
    main()
