"""PgQueuer: a worker frozen past its heartbeat and resumed after another took its job over
finishes the job under its new owner's feet (the finish is not fenced).

Standalone: needs only pgqueuer and asyncpg, and an empty database you may write to.

    python pgqueuer_late_finish.py postgresql://user:password@host:port/dbname

Two workers run as ``pgq run`` would with heartbeat_timeout and dequeue_timeout 2 s (defaults
30 s and 30 s: the same, slower). One job sleeps 5 s. Half a second in, its worker is frozen
(SIGSTOP); once the other worker has re-picked the job it is thawed (SIGCONT): its sleep is
over, it finishes the job. Exit 0 when pgqueuer_log says the job ended while the second worker
was still running it (reproduced), 1 otherwise.
"""

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from datetime import timedelta

URL = sys.argv[1]


async def worker(log: str) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, PgQueuer, run

    @asynccontextmanager
    async def factory():
        conn = await asyncpg.connect(URL)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint("slow")
        async def slow(job) -> None:
            with open(log, "a") as f:
                f.write(f"start {os.getpid()}\n")
            await asyncio.sleep(5)
            with open(log, "a") as f:
                f.write(f"end {os.getpid()}\n")

        yield pgq
        await conn.close()

    await run(factory, heartbeat_timeout=timedelta(seconds=2),
              dequeue_timeout=timedelta(seconds=2))


async def sql(query: str, *args):
    import asyncpg

    conn = await asyncpg.connect(URL)
    try:
        return await conn.fetch(query, *args)
    finally:
        await conn.close()


async def setup() -> int:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(URL)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    job = (await queries.enqueue("slow", b""))[0]
    await conn.close()
    return job


def lines(log: str) -> list[str]:
    return open(log).read().splitlines() if os.path.exists(log) else []


def main() -> int:
    if len(sys.argv) > 2:
        asyncio.run(worker(sys.argv[2]))
        return 0
    log = tempfile.mktemp(suffix=".log")
    job = asyncio.run(setup())
    procs = {p.pid: p for p in (subprocess.Popen([sys.executable, __file__, URL, log],
                                                 stderr=subprocess.DEVNULL) for _ in range(2))}
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
        print(f"pid {second} re-picked job {job}; thawing pid {first}")
        os.kill(first, signal.SIGCONT)
        while time.monotonic() < end:
            ended = asyncio.run(sql("select status::text from pgqueuer_log where job_id = $1 "
                                    "and status <> 'queued' and status <> 'picked'", job))
            if ended:
                still = f"end {second}" not in lines(log)
                print(f"pgqueuer_log says {ended[0][0]} while pid {second} "
                      f"{'is still running it' if still else 'had finished'}")
                verdict = 0 if still else 1
                break
            time.sleep(0.05)
    finally:
        for p in procs.values():
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()
    print(*lines(log), sep="\n")
    print("REPRODUCED: the late finish was not fenced" if verdict == 0 else "NOT REPRODUCED")
    return verdict


if __name__ == "__main__":
    sys.exit(main())
