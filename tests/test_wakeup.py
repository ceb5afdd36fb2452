"""One wake-up per job, not one per idle worker (issue 32, item 5; issue 31, item 7).

Behaviour, not timing: with several idle worker processes, one holds the listener's token (a
session advisory lock) and listens; a job queued wakes that one, which hands the token on; every
job runs once and the token is held by one worker again afterwards. Before, every idle worker
listened, woke and claimed: about two server transactions per idle worker per job.
"""

from __future__ import annotations

import time

from tenantlab import bench, db, queue

WORKERS = 3

TOKENS = """select count(*) from pg_locks l join pg_stat_activity a on a.pid = l.pid
             where l.locktype = 'advisory' and l.granted and a.datname = current_database()"""


def _tokens(s: db.Scratch) -> int:
    deadline = time.monotonic() + 10
    with s.connect("admin", "test wake tokens", autocommit=True) as admin:
        while (n := db.scalar(admin, TOKENS)) != 1 and time.monotonic() < deadline:
            time.sleep(0.1)  # a worker polls (0.5 s) before it takes a free token
    return int(n)


def test_one_idle_worker_listens_and_every_job_runs_once(scratch: db.Scratch) -> None:
    procs = [bench.subprocess.Popen(bench._worker_argv("--name", f"wake-{i}"),
                                    env=bench._env(scratch), stdout=bench.subprocess.DEVNULL,
                                    stderr=bench.subprocess.DEVNULL) for i in range(WORKERS)]
    try:
        assert _tokens(scratch) == 1
        with scratch.connect("worker", "test wake", autocommit=True) as conn:
            for _ in range(3):
                queue.enqueue(conn, "noop", tenant=1)
                deadline = time.monotonic() + 10
                while conn.execute("select count(*) from jobs where status <> 'done'"
                                   ).fetchone() != (0,) and time.monotonic() < deadline:
                    time.sleep(0.02)
            runs = conn.execute("select count(*), count(distinct job_id) from job_runs"
                                ).fetchone()
        assert runs == (3, 3)
        assert _tokens(scratch) == 1  # handed on (or taken again): one listener
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
