"""procrastinate as rows of the matrix: ★ its true defaults (no retry, no stalled-jobs recipe,
a worker polling every 5 s besides LISTEN/NOTIFY), ``scaled`` the same with its heartbeat
timers at the scenario's lease (it has no timer that hands a job to another worker without the
recipe), and ``recommended`` what its docs recommend, each setting quoted in ``QUOTES``: a
``RetryStrategy`` and the "retry stalled jobs" recipe.

Two tasks: ``tenantlab_body`` (async) for every body but blocking work, and
``tenantlab_body_sync``, a sync task, for the ``block`` body: procrastinate runs a sync task in
a thread, as its docs say blocking work should be written; the ``block-loop`` scenario calls
blocking work from the async task, against the docs. The body sees ``job.attempts + 1``
(procrastinate counts previous attempts). procrastinate has no per-job maximum of attempts:
the worker's task definition decides, so ``max_attempts`` reaches the worker's command line,
not the job. No per-job connection hook (a task opens its own connections, if any): no
tenant-leak scenario. Behind PgBouncer its connector gets a null pool
(``AsyncNullConnectionPool``), as its connector page says for an external pooler.

The recommended row's stalled-jobs sweep runs as a maintenance process (``maintenance``): the
recipe's body (``get_stalled_jobs`` then ``retry_job`` for each), every 2 s instead of the
docs' example of every 10 minutes (so the scenario's cap sees it), with
``seconds_since_heartbeat`` the suite's longest job plus a margin and the workers' heartbeat
timings adjusted to it, as the recipe asks. ``retry_job`` counts an attempt but never asks the
task's retry strategy.

``Options.extra["retry"]`` sets the task's ``retry`` argument as given (``True``: retry for
ever, as the docs' "Retry indefinitely"); without it the row's setting decides.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..adapter import Options, Policy, State
from ._peers import LONGEST_JOB, MARGIN, Peer, install_hint, parse, quoted, tagged, three_rows

TASK = "tenantlab_body"
SYNC_TASK = "tenantlab_body_sync"  # blocking work: a sync task, run in a thread
DOCS = "https://procrastinate.readthedocs.io/en/stable"
POLL = 5.0  # the worker's fetch_job_polling_interval default
STALLED = LONGEST_JOB + MARGIN  # the recommended row's seconds_since_heartbeat
SWEEP = 2.0  # seconds between the recommended row's stalled-jobs sweeps
STATES: dict[str, State] = {"todo": "queued", "doing": "running", "succeeded": "done",
                            "failed": "failed", "cancelled": "failed", "aborting": "running",
                            "aborted": "failed"}


class Procrastinate(Peer):
    """procrastinate, through its own App, PsycopgConnector and worker."""

    def install(self, dsn: str) -> None:
        app = _app(dsn, "install")
        with app.open():
            app.schema_manager.apply_schema()

    def enqueue(self, dsn: str, kind: str, tenant: int, payload: dict[str, Any],
                options: Options) -> str:
        app = _app(dsn, "enqueue")
        with app.open():
            task = SYNC_TASK if kind == "block" else TASK
            job_id = app.configure_task(task).defer(kind=kind, tenant=tenant, payload=payload)
        return str(job_id)

    def maintenance_command(self, dsn: str, options: Options) -> list[str] | None:
        return self.command("maintenance", dsn, options) if self.setting == "recommended" else None

    def states(self, dsn: str) -> dict[str, State]:
        import psycopg

        with psycopg.connect(tagged(dsn, "suite procrastinate states")) as conn:
            rows = conn.execute("select id, status::text from procrastinate_jobs").fetchall()
        return {str(i): STATES.get(s, "running") for i, s in rows}

    def created(self, dsn: str) -> dict[str, float]:
        """Each job's deferral on the server's clock (its ``deferred`` event)."""
        import psycopg

        with psycopg.connect(tagged(dsn, "suite procrastinate created")) as conn:
            rows = conn.execute("select job_id, extract(epoch from at)::float8"
                                " from procrastinate_events where type = 'deferred'").fetchall()
        return {str(i): float(t) for i, t in rows}


def _app(dsn: str, role: str) -> Any:
    import procrastinate

    return procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=tagged(dsn, f"suite procrastinate {role}")))


def retry_value(setting: str, max_attempts: int, given: str | None) -> Any:
    """The task's ``retry``: the row's, or the one given (``true``, a number)."""
    import procrastinate

    if given is not None:
        return True if given.lower() == "true" else int(given)
    if setting == "recommended" and max_attempts > 1:
        # procrastinate's max_attempts counts retries ("retry=5: 6 attempts total"); 0 would
        # mean no limit at all, so one attempt is no retry strategy.
        return procrastinate.RetryStrategy(max_attempts=max_attempts - 1, wait=1)
    return False


def heartbeat(setting: str, lease: float) -> dict[str, Any]:
    """The worker's heartbeat timings: the defaults (10 s, 30 s), scaled to the lease, or
    adjusted to the recommended row's ``seconds_since_heartbeat``."""
    if setting == "scaled":
        return {"update_heartbeat_interval": lease / 3, "stalled_worker_timeout": lease}
    if setting == "recommended":
        return {"update_heartbeat_interval": STALLED / 3, "stalled_worker_timeout": STALLED}
    return {}


def _connector(dsn: str, name: str, pooler: bool) -> Any:
    import procrastinate

    if pooler:
        # Behind PgBouncer: no pool of its own (its connector page).
        import psycopg_pool

        return procrastinate.PsycopgConnector(conninfo=tagged(dsn, name),
                                              pool_factory=psycopg_pool.AsyncNullConnectionPool)
    return procrastinate.PsycopgConnector(conninfo=tagged(dsn, name))


async def worker(args: Any) -> None:
    """Run one procrastinate worker that executes the suite's bodies."""
    import procrastinate

    from .. import bodies

    app = procrastinate.App(connector=_connector(args.dsn, "check procrastinate worker",
                                                 args.pooler))
    retry = retry_value(args.setting, args.max_attempts, args.retry)

    @app.task(name=TASK, pass_context=True, retry=retry)
    async def body(context: procrastinate.JobContext, kind: str, tenant: Any,
                   payload: dict[str, Any]) -> None:
        job = context.job
        await bodies.run_async(args.history, kind, job.id, attempt=job.attempts + 1,
                               tenant=tenant, payload=payload)

    @app.task(name=SYNC_TASK, pass_context=True, retry=retry)
    def body_sync(context: procrastinate.JobContext, kind: str, tenant: Any,
                  payload: dict[str, Any]) -> None:
        # A sync task: procrastinate runs it in a thread, as its docs say for blocking work.
        job = context.job
        bodies.run(args.history, kind, job.id, attempt=job.attempts + 1, tenant=tenant,
                   payload=payload)

    async with app.open_async():
        await app.run_worker_async(**heartbeat(args.setting, args.lease))


async def sweep(args: Any) -> None:
    """Run the "retry stalled jobs" recipe every SWEEP seconds until killed."""
    import procrastinate

    app = procrastinate.App(connector=_connector(args.dsn, "check procrastinate maintenance",
                                                 False))
    async with app.open_async():
        while True:
            for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=STALLED):
                await app.job_manager.retry_job(job)
            await asyncio.sleep(SWEEP)


def _policy(setting: str, options: Options) -> Policy:
    """No retry (★, scaled): a failure final at once; recommended: retries 1 s apart, each
    picked up within a poll. A stalled job: never retried without the recipe; with it, retried
    by ``retry_job``, which no strategy ends."""
    if setting == "recommended":
        n = options.max_attempts
        return Policy(budget=n, timeout=STALLED + SWEEP, poison_final=(n - 1) * (1 + POLL),
                      crash_final=None, poll=POLL,
                      basis=f"RetryStrategy max_attempts {n - 1} retries, wait 1 s, polls every "
                            f"{POLL:g} s; stalled jobs retried by retry_job after "
                            f"{STALLED:g} s without a heartbeat, every {SWEEP:g} s")
    return Policy(budget=1, timeout=None, poison_final=POLL, crash_final=None, poll=POLL,
                  basis="retry=False; a stalled job stays doing: no recipe")


QUOTES = {
    "retry": (f"{DOCS}/howto/advanced/retry.html",
              "You can define a retry strategy on a task and Procrastinate will enforce it."),
    "stalled jobs": (f"{DOCS}/howto/production/retry_stalled_jobs.html",
                     "Those stalled jobs can then be retried for example by a periodic task."),
    "heartbeat": (f"{DOCS}/howto/production/retry_stalled_jobs.html",
                  "If you change the seconds_since_heartbeat parameter, make sure to also check "
                  "the update_heartbeat_interval and stalled_worker_timeout parameters of the "
                  "worker and adjust them accordingly."),
    "blocking work": (f"{DOCS}/discussions.html",
                      "For running jobs, support of synchronous task functions is through "
                      "asgiref.sync.sync_to_async. This means your synchronous function will be "
                      "executed by an asynchronous worker in a thread."),
    "behind PgBouncer": (f"{DOCS}/howto/basics/connector.html",
                         "This is useful when you use PgBouncer or some other external pooler "
                         "in order to resolve pooling outside of your application."),
}


class Row(Procrastinate):
    def policy(self, options: Options) -> Policy:
        return _policy(self.setting, options)


def rows() -> list[Peer]:
    hint = install_hint("procrastinate==3.10.*")
    promises = ("A failed job is retried only as its task's retry strategy says; a worker killed "
                "mid-job leaves it 'doing' until the stalled-jobs recipe retries it.")
    links = {"retry": f"{DOCS}/howto/advanced/retry.html",
             "stalled jobs": f"{DOCS}/howto/production/retry_stalled_jobs.html",
             "heartbeat": f"{DOCS}/howto/production/retry_stalled_jobs.html",
             "connector": f"{DOCS}/howto/basics/connector.html",
             "concurrency": f"{DOCS}/howto/production/concurrency.html",
             "blocking work": f"{DOCS}/discussions.html",
             "behind PgBouncer": f"{DOCS}/howto/basics/connector.html"}
    base = {"retry": "False (no retry)", "stalled jobs": "not retried (no recipe)",
            "heartbeat": "update_heartbeat_interval 10 s, stalled_worker_timeout 30 s",
            "connector": "PsycopgConnector", "concurrency": 1,
            "blocking work": "a sync task (run in a thread)",
            "behind PgBouncer": "pool_factory=AsyncNullConnectionPool"}
    scaled = {**base, "heartbeat": "update_heartbeat_interval lease/3, stalled_worker_timeout "
                                   "lease (the scenario's, 2 s)"}
    values = {"retry": "RetryStrategy(max_attempts=max_attempts-1, wait=1)",
              "stalled jobs": f"retry_stalled_jobs recipe: get_stalled_jobs("
                              f"seconds_since_heartbeat={STALLED:g}) + retry_job, every "
                              f"{SWEEP:g} s (the docs' example: every 10 min)",
              "heartbeat": f"update_heartbeat_interval {STALLED / 3:.3g} s, "
                           f"stalled_worker_timeout {STALLED:g} s",
              "blocking work": "a sync task (run in a thread)",
              "behind PgBouncer": "pool_factory=AsyncNullConnectionPool"}
    recommended: dict[str, Any] = {**base, **{k: quoted(v, *QUOTES[k]) for k, v in values.items()}}
    features = frozenset({"attempts", "event-loop", "pgbouncer"})
    return [Row(name="procrastinate", setting=setting, distribution="procrastinate",
                settings=settings, links=links, promises=promises, install_hint=hint,
                features=features)
            for setting, settings in three_rows(base, scaled, recommended)]


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    asyncio.run(worker(args) if args.role == "worker" else sweep(args))


if __name__ == "__main__":
    main()
