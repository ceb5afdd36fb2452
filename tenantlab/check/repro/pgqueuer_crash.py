"""PgQueuer: a job that kills its worker is re-picked for ever, its attempts never counted.

Standalone: needs only pgqueuer and asyncpg, and an empty database you may write to.

    python pgqueuer_crash.py postgresql://user:password@host:port/dbname

One entrypoint kills its own process (SIGKILL) mid-job; an ``ok`` job is queued behind it. A
worker runs as ``pgq run`` would with heartbeat_timeout and dequeue_timeout 2 s (its defaults are
30 s and 30 s: the same loop, 15 times slower), and is restarted whenever it dies, as a
supervisor would. Each execution appends a line to a file. No retry is configured (its default),
so the job may run once: exit 0 when it ran 3 times with its attempt count never rising
(reproduced), 1 when it did not.
"""

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

URL = sys.argv[1]


async def worker(log: str) -> None:
    from contextlib import asynccontextmanager

    import asyncpg
    from pgqueuer import AsyncpgDriver, PgQueuer, run

    @asynccontextmanager
    async def factory():
        conn = await asyncpg.connect(URL)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint("crash")
        async def crash(job) -> None:
            with open(log, "a") as f:
                f.write(f"crash job {job.id} attempts {job.attempts} pid {os.getpid()}\n")
            os.kill(os.getpid(), signal.SIGKILL)

        @pgq.entrypoint("ok")
        async def ok(job) -> None:
            with open(log, "a") as f:
                f.write(f"ok job {job.id} pid {os.getpid()}\n")

        yield pgq
        await conn.close()

    await run(factory, heartbeat_timeout=timedelta(seconds=2),
              dequeue_timeout=timedelta(seconds=2))


async def setup() -> tuple[int, int]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(URL)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    crash = (await queries.enqueue("crash", b""))[0]
    ok = (await queries.enqueue("ok", b""))[0]
    await conn.close()
    return crash, ok


def main() -> int:
    if len(sys.argv) > 2:
        asyncio.run(worker(sys.argv[2]))
        return 0
    crash, ok = asyncio.run(setup())
    log = tempfile.mktemp(suffix=".log")
    procs: list[subprocess.Popen] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            procs = [p for p in procs if p.poll() is None]
            if not procs:  # the supervisor: restart a worker that died
                procs.append(subprocess.Popen([sys.executable, __file__, URL, log],
                                              stderr=subprocess.DEVNULL))
            runs = open(log).read().splitlines() if os.path.exists(log) else []
            if sum(line.startswith("crash") for line in runs) >= 3:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    runs = open(log).read().splitlines() if os.path.exists(log) else []
    print(*runs, sep="\n")
    crashes = [line for line in runs if line.startswith("crash")]
    counted = {line.split(" attempts ")[1].split()[0] for line in crashes}
    ran_ok = any(line.startswith("ok") for line in runs)
    print(f"crash job {crash}: {len(crashes)} executions, attempts seen {sorted(counted)}; "
          f"job {ok} behind it {'ran' if ran_ok else 'never ran'}")
    if len(crashes) >= 3 and counted == {"0"}:
        print("REPRODUCED: re-picked after every stale heartbeat, its attempts never counted")
        return 0
    print("NOT REPRODUCED")
    return 1


if __name__ == "__main__":
    sys.exit(main())
