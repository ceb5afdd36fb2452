"""PgQueuer, against its docs (blocking work called on the event loop instead of through
``asyncio.to_thread``): the blocked loop cannot heartbeat, so another worker re-picks the job
while it still runs.

Standalone: needs only pgqueuer and asyncpg, and an empty database you may write to.

    python pgqueuer_block_loop.py postgresql://user:password@host:port/dbname

Two workers run as ``pgq run`` would with heartbeat_timeout and dequeue_timeout 2 s (defaults
30 s and 30 s: the same with a job longer than 30 s). One job blocks its loop for 5 s
(``time.sleep``). Exit 0 when the second worker started the job while the first was still
running it (reproduced), 1 otherwise. Its docs say to wrap blocking calls with
``asyncio.to_thread``; with that, the same job runs once.
"""

import asyncio
import os
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

        @pgq.entrypoint("blocking")
        async def blocking(job) -> None:
            with open(log, "a") as f:
                f.write(f"start {os.getpid()} {time.time()}\n")
            time.sleep(5)  # against the docs: blocks the loop (and its heartbeat)
            with open(log, "a") as f:
                f.write(f"end {os.getpid()} {time.time()}\n")

        yield pgq
        await conn.close()

    await run(factory, heartbeat_timeout=timedelta(seconds=2),
              dequeue_timeout=timedelta(seconds=2))


async def setup() -> int:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(URL)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    job = (await queries.enqueue("blocking", b""))[0]
    await conn.close()
    return job


def main() -> int:
    if len(sys.argv) > 2:
        asyncio.run(worker(sys.argv[2]))
        return 0
    log = tempfile.mktemp(suffix=".log")
    job = asyncio.run(setup())
    procs = [subprocess.Popen([sys.executable, __file__, URL, log], stderr=subprocess.DEVNULL)
             for _ in range(2)]
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            runs = open(log).read().splitlines() if os.path.exists(log) else []
            if sum(x.startswith("end") for x in runs) >= 1 and len(runs) >= 3:
                break
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    seen = [x.split() for x in open(log).read().splitlines()] if os.path.exists(log) else []
    print(*(" ".join(r) for r in seen), sep="\n")
    starts = [(int(r[1]), float(r[2])) for r in seen if r[0] == "start"]
    ends = {int(r[1]): float(r[2]) for r in seen if r[0] == "end"}
    overlap = len(starts) > 1 and starts[1][1] < ends.get(starts[0][0], float("inf"))
    print(f"job {job}: {len(starts)} executions" + (", the second started while the first ran"
                                                    if overlap else ""))
    print("REPRODUCED: re-picked while its blocked worker still ran it" if overlap
          else "NOT REPRODUCED")
    return 0 if overlap else 1


if __name__ == "__main__":
    sys.exit(main())
