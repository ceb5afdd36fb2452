"""One wake-up per job, not one per idle worker (issue 32, item 5; issue 31, item 7).

Through the real path: idle processes of the production worker (``python -m jobqueue``) on the
product's schema with the README's grants (an ordinary role), jobs queued one at a time. Each
worker logs at its stop how many claims of its own it made (not those riding on a finish): every
idle worker that wakes on an enqueue and claims adds one. Before the wake chain every idle worker
woke and claimed on every job (about WORKERS + 1 claims per job); now the one named claims, and
its finish's claim carries it back to idle (one claim per job). Counts, not timings.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time

from tenantlab import bench, queue

WORKERS, JOBS = 4, 8
STOPPED = re.compile(r"stopped: (\d+) jobs claimed; (\d+) claims of their own, (\d+) found nothing")


def test_idle_workers_claim_once_per_job_and_every_job_runs_once(admin_dsn: str) -> None:
    with bench.product_db() as p:
        procs = [subprocess.Popen(bench._worker_argv("-v", "--poll", "30", "--name", f"wake-{i}"),
                                  env=bench._env(p), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for i in range(WORKERS)]
        logs = []
        try:
            with p.connect("worker", "test wake", autocommit=True) as conn:
                deadline = time.monotonic() + 60
                while conn.execute("select count(*) from jobqueue.workers").fetchone() != \
                        (WORKERS,):
                    assert time.monotonic() < deadline, "the workers did not start"
                    assert all(x.poll() is None for x in procs)
                    time.sleep(0.1)
                time.sleep(1.0)  # each past its first claim, waiting
                for _ in range(JOBS):
                    queue.enqueue(conn, "noop", tenant=1)
                    deadline = time.monotonic() + 20
                    while conn.execute("select count(*) from jobqueue.jobs where status <> 'done'"
                                       ).fetchone() != (0,):
                        assert time.monotonic() < deadline, "a job never ran"
                        time.sleep(0.02)
                    time.sleep(0.2)  # idle again
                runs = conn.execute("select count(*), count(distinct job_id) from "
                                    "jobqueue.job_runs").fetchone()
        finally:
            for x in procs:
                x.send_signal(signal.SIGTERM)
            for x in procs:
                logs.append(x.communicate(timeout=30)[1])
    assert runs == (JOBS, JOBS)
    counts = [STOPPED.search(text) for text in logs]
    assert all(counts), logs
    claimed = sum(int(m[1]) for m in counts if m)
    rounds = sum(int(m[2]) for m in counts if m)
    assert claimed == JOBS
    # Each worker's first claim at its start, then one per job (a little slack for a start
    # that overlaps); every idle worker claiming on every job would be about WORKERS * JOBS.
    assert rounds <= WORKERS + JOBS + 2, logs
