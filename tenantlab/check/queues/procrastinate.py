"""procrastinate as a row of the matrix: its defaults (★), and what its docs recommend for
reliability (a ``RetryStrategy`` and the "retry stalled jobs" recipe).

One task, ``tenantlab_body``, with the body's kind, tenant and payload as its arguments; the
body sees ``job.attempts + 1`` as its attempt (procrastinate counts previous attempts).
procrastinate has no per-job maximum of attempts: the worker's task definition decides, so
``max_attempts`` reaches the worker's command line, not the job. It has no per-job connection
hook either (a task opens its own connections, if any): no tenant-leak scenario.

The recommended row's stalled-jobs sweep runs as a maintenance process (``maintenance``): the
recipe's body (``get_stalled_jobs`` then ``retry_job`` for each) every ``lease`` seconds, with
``seconds_since_heartbeat`` = lease and the workers' heartbeat timings scaled to match, as the
recipe asks. ``retry_job`` counts an attempt but never asks the task's retry strategy.

``Options.extra["retry"]`` sets the task's ``retry`` argument as given (``True``: retry for
ever, as the docs' "Retry indefinitely"); without it the row's setting decides.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..adapter import Options, State
from ._peers import Peer, install_hint, parse, tagged

TASK = "tenantlab_body"
DOCS = "https://procrastinate.readthedocs.io/en/stable"
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
            job_id = app.configure_task(TASK).defer(kind=kind, tenant=tenant, payload=payload)
        return str(job_id)

    def maintenance_command(self, dsn: str, options: Options) -> list[str] | None:
        return self.command("maintenance", dsn, options) if self.setting == "recommended" else None

    def states(self, dsn: str) -> dict[str, State]:
        import psycopg

        with psycopg.connect(tagged(dsn, "suite procrastinate states")) as conn:
            rows = conn.execute("select id, status::text from procrastinate_jobs").fetchall()
        return {str(i): STATES.get(s, "running") for i, s in rows}


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
    """The worker's heartbeat timings: the defaults, or scaled to the lease (recommended)."""
    if setting == "recommended":
        return {"update_heartbeat_interval": lease / 3, "stalled_worker_timeout": lease}
    return {}


async def worker(args: Any) -> None:
    """Run one procrastinate worker that executes the suite's bodies."""
    import procrastinate

    from .. import bodies

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=tagged(args.dsn, "check procrastinate worker")))

    @app.task(name=TASK, pass_context=True,
              retry=retry_value(args.setting, args.max_attempts, args.retry))
    async def body(context: procrastinate.JobContext, kind: str, tenant: Any,
                   payload: dict[str, Any]) -> None:
        job = context.job
        await bodies.run_async(args.history, kind, job.id, attempt=job.attempts + 1,
                               tenant=tenant, payload=payload)

    async with app.open_async():
        await app.run_worker_async(**heartbeat(args.setting, args.lease))


async def sweep(args: Any) -> None:
    """Run the "retry stalled jobs" recipe every ``lease`` seconds until killed."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=tagged(args.dsn, "check procrastinate maintenance")))
    async with app.open_async():
        while True:
            for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=args.lease):
                await app.job_manager.retry_job(job)
            await asyncio.sleep(args.lease)


def rows() -> list[Peer]:
    hint = install_hint("procrastinate==3.10.*")
    promises = ("A failed job is retried only as its task's retry strategy says; a worker killed "
                "mid-job leaves it 'doing' until the stalled-jobs recipe retries it.")
    return [
        Procrastinate(
            name="procrastinate", setting="default", distribution="procrastinate",
            settings={"retry": "False (no retry)", "stalled jobs": "not retried (no recipe)",
                      "connector": "PsycopgConnector", "concurrency": 1},
            links={"retry": f"{DOCS}/howto/advanced/retry.html",
                   "stalled jobs": f"{DOCS}/howto/production/retry_stalled_jobs.html",
                   "connector": f"{DOCS}/howto/basics/connector.html",
                   "concurrency": f"{DOCS}/howto/production/concurrency.html"},
            promises=promises, install_hint=hint),
        Procrastinate(
            name="procrastinate", setting="recommended", distribution="procrastinate",
            settings={"retry": "RetryStrategy(max_attempts=max_attempts-1, wait=1)",
                      "stalled jobs": "retry_stalled_jobs recipe: get_stalled_jobs("
                                      "seconds_since_heartbeat=lease) + retry_job, every lease",
                      "heartbeat": "update_heartbeat_interval=lease/3, "
                                   "stalled_worker_timeout=lease",
                      "connector": "PsycopgConnector", "concurrency": 1},
            links={"retry": f"{DOCS}/howto/advanced/retry.html",
                   "stalled jobs": f"{DOCS}/howto/production/retry_stalled_jobs.html",
                   "heartbeat": f"{DOCS}/howto/production/retry_stalled_jobs.html",
                   "connector": f"{DOCS}/howto/basics/connector.html",
                   "concurrency": f"{DOCS}/howto/production/concurrency.html"},
            promises=promises, install_hint=hint),
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    asyncio.run(worker(args) if args.role == "worker" else sweep(args))


if __name__ == "__main__":
    main()
