"""procrastinate, its defaults: a job whose worker was killed stays 'doing' for ever.

Standalone: needs only procrastinate (and its psycopg), and an empty database you may write to.

    python procrastinate_crash.py postgresql://user:password@host:port/dbname

A task kills its own process (SIGKILL) mid-job. A worker with procrastinate's defaults runs
it; when it dies a new worker starts, as a supervisor would. Without the "retry stalled jobs"
recipe nothing retries the job: it stays 'doing' while a live worker idles beside it. Exit 0
when the job is still "doing" 8 s after the crash with a live worker (reproduced), 1 otherwise.
"""

import os
import signal
import subprocess
import sys
import time

import procrastinate

URL = sys.argv[1]
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))


@app.task(name="crash")
def crash() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def status(job_id: int) -> str:
    import psycopg

    with psycopg.connect(URL) as conn:
        row = conn.execute("select status::text from procrastinate_jobs where id = %s",
                           (job_id,)).fetchone()
    return row[0] if row else "missing"


def main() -> int:
    if len(sys.argv) > 2:
        app.run_worker(install_signal_handlers=False)
        return 0
    with app.open():
        app.schema_manager.apply_schema()
        job_id = crash.defer()
    procs: list[subprocess.Popen] = []
    crashed_at = None
    try:
        end = time.monotonic() + 40
        while time.monotonic() < end:
            procs = [p for p in procs if p.poll() is None]
            if not procs:  # the supervisor: restart a worker that died
                if crashed_at is None and status(job_id) == "doing":
                    crashed_at = time.monotonic()
                procs.append(subprocess.Popen([sys.executable, __file__, URL, "worker"],
                                              stderr=subprocess.DEVNULL))
            if crashed_at is not None and time.monotonic() - crashed_at > 8:
                break
            time.sleep(0.2)
        final = status(job_id)
        alive = [p for p in procs if p.poll() is None]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    waited = time.monotonic() - crashed_at if crashed_at else 0
    print(f"job {job_id}: {final} {waited:.0f} s after its worker was killed, "
          f"{len(alive)} live worker(s) beside it")
    if crashed_at is not None and final == "doing" and alive:
        print("REPRODUCED: nothing retries a stalled job without the retry-stalled-jobs recipe")
        return 0
    print("NOT REPRODUCED")
    return 1


if __name__ == "__main__":
    sys.exit(main())
