"""awa, as its docs recommend: the heartbeat rescue of a crashed job ignores its max_attempts,
so a job that kills its worker runs past its budget for ever.

Standalone: needs only awa-pg, and an empty database you may write to.

    python awa_crash.py postgresql://user:password@host:port/dbname

The job is inserted with ``max_attempts=2``; its handler kills its own process (SIGKILL).
Workers run with its configuration guide's "5-second crash detection target"
(heartbeat_interval 1 s, heartbeat_staleness 4 s, heartbeat_rescue_interval 1 s), on its
queue storage (finalized before the insert, as its quickstart says), and are restarted when
they die, as a supervisor would. Exit 0 when the job ran more than 2 times (reproduced), 1
otherwise.
"""

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import awa

URL = sys.argv[1]


@dataclass
class Crash:
    log: str


async def worker() -> None:
    client = awa.AsyncClient(URL)

    @client.task(Crash, kind="crash", queue="repro")
    async def crash(job) -> None:
        with open(job.args.log, "a") as f:
            f.write(f"execution, attempt {job.attempt}, pid {os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)

    await client.start([("repro", 1)], heartbeat_interval_ms=1000, heartbeat_staleness_ms=4000,
                       heartbeat_rescue_interval_ms=1000)
    await asyncio.Event().wait()


async def setup(log: str) -> int:
    client = awa.AsyncClient(URL)
    await client.migrate()

    @client.task(Crash, kind="crash", queue="repro")
    async def nothing(job) -> None:
        return None

    await client.start([("repro", 1)])  # finalizes its queue storage, as its quickstart says
    await client.shutdown()
    job = await client.insert(Crash(log), kind="crash", queue="repro", max_attempts=2)
    return job.id


def main() -> int:
    if sys.argv[2:] == ["worker"]:
        asyncio.run(worker())
        return 0
    log = tempfile.mktemp(suffix=".log")
    job_id = asyncio.run(setup(log))
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
        for p in procs:
            p.kill()
            p.wait()
    runs = open(log).read().splitlines() if os.path.exists(log) else []
    print(*runs, sep="\n")
    print(f"job {job_id}: {len(runs)} executions; max_attempts 2")
    if len(runs) > 2:
        print("REPRODUCED: the heartbeat rescue retried it past max_attempts")
        return 0
    print("NOT REPRODUCED")
    return 1


if __name__ == "__main__":
    sys.exit(main())
