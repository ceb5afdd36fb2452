"""procrastinate, with its "retry stalled jobs" recipe: a worker frozen past its heartbeat and
resumed after the recipe gave its job to another worker finishes the job under its new
owner's feet (the finish is not fenced).

Standalone: needs only procrastinate (and its psycopg), and an empty database you may write to.

    python procrastinate_late_finish.py postgresql://user:password@host:port/dbname

Two workers heartbeat every second; the recipe (``get_stalled_jobs`` then ``retry_job``) runs
every second with ``seconds_since_heartbeat=3`` (its docs' example: every 10 minutes, 30 s: the
same, slower). One job sleeps 5 s. Half a second in, its worker is frozen (SIGSTOP); once the
other worker has started the retried job it is thawed (SIGCONT): its sleep is over, it finishes
the job. Exit 0 when procrastinate_jobs says succeeded while the second worker was still
running it (reproduced), 1 otherwise.
"""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

import procrastinate
import psycopg

URL = sys.argv[1]
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))


@app.task(name="slow")
async def slow(log: str) -> None:
    with open(log, "a") as f:
        f.write(f"start {os.getpid()}\n")
    await asyncio.sleep(5)
    with open(log, "a") as f:
        f.write(f"end {os.getpid()}\n")


async def sweep() -> None:
    async with app.open_async():
        while True:
            for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=3):
                await app.job_manager.retry_job(job)
            await asyncio.sleep(1)


def lines(log: str) -> list[str]:
    return open(log).read().splitlines() if os.path.exists(log) else []


def status(job: int) -> str:
    with psycopg.connect(URL) as conn:
        row = conn.execute("select status::text from procrastinate_jobs where id = %s",
                           (job,)).fetchone()
    return row[0] if row else "missing"


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
        job = slow.defer(log=log)
    procs = [subprocess.Popen([sys.executable, __file__, URL, role], stderr=subprocess.DEVNULL)
             for role in ("worker", "worker", "sweep")]
    verdict = 1
    try:
        end = time.monotonic() + 60
        while not lines(log) and time.monotonic() < end:
            time.sleep(0.1)
        first = int(lines(log)[0].split()[1])
        time.sleep(0.5)
        os.kill(first, signal.SIGSTOP)
        print(f"froze pid {first}")
        while len([x for x in lines(log) if x.startswith("start")]) < 2 and time.monotonic() < end:
            time.sleep(0.1)
        second = int([x for x in lines(log) if x.startswith("start")][-1].split()[1])
        print(f"pid {second} started the retried job {job}; thawing pid {first}")
        os.kill(first, signal.SIGCONT)
        while time.monotonic() < end:
            if (st := status(job)) == "succeeded":
                still = f"end {second}" not in lines(log)
                print(f"procrastinate_jobs says {st} while pid {second} "
                      f"{'is still running it' if still else 'had finished'}")
                verdict = 0 if still else 1
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()
    print(*lines(log), sep="\n")
    print("REPRODUCED: the late finish was not fenced" if verdict == 0 else "NOT REPRODUCED")
    return verdict


if __name__ == "__main__":
    sys.exit(main())
