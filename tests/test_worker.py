"""Real worker processes: crashes (a real os._exit), a clean stop on SIGTERM, nothing left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tenantlab import db, events, queue, worker
from tenantlab.experiments._workers import fleet
from tenantlab.queries import q

pytestmark = pytest.mark.slow


@pytest.fixture
def conn(scratch: db.Scratch):
    with scratch.connect("worker", "test worker", autocommit=True) as c:
        yield c


@pytest.fixture
def env(env_with_db: dict[str, str], scratch: db.Scratch) -> dict[str, str]:
    return dict(env_with_db, TENANTLAB_DSN=scratch.worker)


def start(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tenantlab", "worker", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def states(conn) -> dict[int, dict]:
    return {s["id"]: s for s in queue.job_states(conn)}


@pytest.mark.parametrize("design", [
    pytest.param("single", marks=pytest.mark.xfail(
        strict=True, reason="crash: the dead worker's transaction rolls back, the job is queued "
                            "with attempts 0 again and kills every next worker")),
    "leased",
])
def test_a_crashing_job_is_counted_and_the_queue_moves_on(conn, env, design: str) -> None:
    crash = queue.enqueue(conn, "crash", tenant=1, max_attempts=3)[0]
    behind = queue.enqueue(conn, "count", tenant=2)[0]
    crashes = 0
    for _ in range(5):  # fresh worker processes, each after the last one died
        proc = start(env, "--design", design, "--lease", "0.5", "--until-empty",
                     "--poll", "0.05")
        out, err = proc.communicate(timeout=60)
        if proc.returncode == 0:
            break
        assert proc.returncode == 1, err
        assert '"event": "crash"' in out.splitlines()[-1]  # the line went out before the exit
        crashes += 1
        job = states(conn)[crash]
        if design == "leased":
            assert job["attempts"] == crashes  # counted at the claim: the crash cannot undo it
            if job["attempts"] < job["max_attempts"]:
                wait_for(lambda: crash in [r[0] for r in conn.execute(q("eligible_leased"))],
                         what="the lease to expire")
    s = states(conn)
    assert s[behind]["status"] == "done"
    assert crashes == 3
    assert s[crash]["attempts"] == 3


def test_sigterm_lets_the_current_job_finish(conn, env, tmp_path: Path) -> None:
    current, nxt = queue.enqueue(conn, "sleep", tenant=1, seconds=1.5, count=2)
    log = tmp_path / "events.jsonl"
    proc = start(env, "--design", "leased", "--events", str(log), "--poll", "0.05")
    try:
        wait_for(lambda: any(e["event"] == "execute" for e in events.read(log)),
                 what="the first job to start")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    s = states(conn)
    assert (s[current]["status"], s[current]["runs"]) == ("done", 1)
    assert (s[nxt]["status"], s[nxt]["attempts"]) == ("queued", 0)
    names = [e["event"] for e in events.read(log)]
    assert names.index("stop-requested") < names.index("finish") < names.index("worker-stop")


def test_fleet_ends_every_worker_and_its_backend(scratch: db.Scratch, admin_dsn: str,
                                                 tmp_path: Path) -> None:
    with scratch.connect("worker", "test fleet", autocommit=True) as conn:
        queue.enqueue(conn, "sleep", tenant=1, seconds=0.5)
    with fleet(scratch.worker) as f:
        procs = [f.start(design=d, name=f"idle-{d}", events=tmp_path / "ev.jsonl", poll=0.05)
                 for d in ("single", "leased")]
        wait_for(lambda: len(_backends(admin_dsn, scratch.name)) == 2, what="two workers")
    assert all(p.returncode is not None for p in procs)
    wait_for(lambda: _backends(admin_dsn, scratch.name) == [], what="backends to go")


def _backends(admin_dsn: str, dbname: str) -> list[dict]:
    return [b for b in db.leftover_backends(admin_dsn) if b["datname"] == dbname]


@pytest.mark.parametrize("args, message", [
    (["worker", "--lease", "0"], "lease must be a positive number of seconds, not '0'"),
    (["worker", "--design", "fifo"], "invalid choice: 'fifo' (choose from single, leased)"),
    (["worker", "--max-jobs", "-1"], "max-jobs must be a positive whole number"),
    (["enqueue", "--kind", "email"], "invalid choice: 'email' (choose from count, sleep, fail"),
    (["enqueue", "--kind", "count", "--tenant", "0"], "tenant must be a number from 1 to 100"),
])
def test_bad_arguments_say_what_is_valid(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "tenantlab", *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert message in r.stderr.replace("'single', 'leased'", "single, leased").replace(
        "'count', 'sleep', 'fail'", "count, sleep, fail")


def test_a_worker_logs_in_as_the_worker_role(scratch: db.Scratch) -> None:
    dsn = worker.worker_dsn(scratch.admin)
    with db.connect(dsn, "test whoami", autocommit=True) as c:
        assert c.execute(q("whoami")).fetchone()[0] == db.WORKER
