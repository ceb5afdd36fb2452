"""procrastinate, as its docs recommend: ``retry_job`` in the stalled-jobs recipe ignores the
task's retry strategy, so a job that kills its worker runs past its budget for ever.

Standalone: needs only procrastinate (and its psycopg), and an empty database you may write to.

    python procrastinate_recipe_crash.py postgresql://user:password@host:port/dbname

The task has ``retry=RetryStrategy(max_attempts=1)`` (2 executions in all) and kills its own
process (SIGKILL). Workers heartbeat every second; the recipe (``get_stalled_jobs`` then
``retry_job``) runs every second with ``seconds_since_heartbeat=3`` (its docs' example: every
10 minutes, 30 s: the same loop, slower). Killed workers are restarted, as a supervisor would.
Exit 0 when the job ran more than 2 times (reproduced), 1 otherwise.
"""

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time

import procrastinate

URL = sys.argv[1]
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))


@app.task(name="crash", pass_context=True,
          retry=procrastinate.RetryStrategy(max_attempts=1, wait=1))
def crash(context: procrastinate.JobContext, log: str) -> None:
    with open(log, "a") as f:
        f.write(f"execution, attempts so far {context.job.attempts}, pid {os.getpid()}\n")
    os.kill(os.getpid(), signal.SIGKILL)


async def sweep() -> None:
    async with app.open_async():
        while True:
            for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=3):
                await app.job_manager.retry_job(job)
            await asyncio.sleep(1)


def main() -> int:
    if sys.argv[2:] == ["worker"]:
        app.run_worker(install_signal_handlers=False, update_heartbeat_interval=1,
                       stalled_worker_timeout=3)
        return 0
    if sys.argv[2:] == ["sweep"]:
        asyncio.run(sweep())
        return 0
    log = tempfile.mktemp(suffix=".log")
    with app.open():
        app.schema_manager.apply_schema()
        job_id = crash.defer(log=log)
    sweeper = subprocess.Popen([sys.executable, __file__, URL, "sweep"], stderr=subprocess.DEVNULL)
    procs: list[subprocess.Popen] = []
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            procs = [p for p in procs if p.poll() is None]
            if not procs:  # the supervisor: restart a worker that died
                procs.append(subprocess.Popen([sys.executable, __file__, URL, "worker"],
                                              stderr=subprocess.DEVNULL))
            runs = open(log).read().splitlines() if os.path.exists(log) else []
            if len(runs) > 2:
                break
            time.sleep(0.2)
    finally:
        for p in [*procs, sweeper]:
            p.kill()
            p.wait()
    runs = open(log).read().splitlines() if os.path.exists(log) else []
    print(*runs, sep="\n")
    print(f"job {job_id}: {len(runs)} executions; its retry strategy allows 2")
    if len(runs) > 2:
        print("REPRODUCED: retry_job retried it past its retry strategy")
        return 0
    print("NOT REPRODUCED")
    return 1


if __name__ == "__main__":
    sys.exit(main())
