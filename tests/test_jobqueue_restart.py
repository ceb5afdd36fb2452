"""PostgreSQL restarts (an immediate stop, then a start) under running workers and a reaper.

Every job still ends done or dead, no worker or reaper exits, and each logs one line per outage.
The server is one of the test's own (not the suite's): stopping it disturbs nobody else.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from tenantlab import db, queue
from tenantlab.server import Server, free_port

pytestmark = pytest.mark.slow


def crash_stop(server: Server) -> None:
    """Stop the server as a power cut would: pg_ctl stop -m immediate (crash recovery at start)."""
    user = server._user()
    bins = server._bindir_for(user)
    server._run([str(bins / "pg_ctl"), "stop", "-w", "-m", "immediate", "-D", str(server.data)],
                user)


def settled(s: db.Scratch) -> tuple[int, int]:
    try:
        with s.connect("admin", "test restart probe", autocommit=True, connect_timeout=2) as c:
            row = c.execute("select count(*) filter (where status in ('done', 'dead')), count(*) "
                            "from jobs").fetchone()
            return int(row[0]), int(row[1])
    except psycopg.OperationalError:
        return -1, -1


@pytest.fixture
def own_server():
    home = Path(tempfile.mkdtemp(prefix="tl-restart-", dir="/tmp"))
    home.chmod(0o755)
    server = Server(home)
    port = free_port()
    try:
        server.up(port=port)
        yield server, port
    finally:
        server.down()
        shutil.rmtree(home, ignore_errors=True)


def test_workers_and_the_reaper_survive_server_restarts(own_server, tmp_path: Path) -> None:
    server, port = own_server
    with db.scratch("restart", server.dsn()) as s:
        with s.connect("worker", "test restart", autocommit=True) as conn:
            queue.enqueue(conn, "sleep", count=600, seconds=0.01, max_attempts=5)
            queue.enqueue(conn, "fail", count=3, max_attempts=2)
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env["TENANTLAB_DSN"] = s.worker
        logs = [tmp_path / f"w{i}.err" for i in range(3)] + [tmp_path / "reaper.err"]
        common = ["--lease", "2", "--heartbeat", "0.5", "--backoff", "0", "--poll", "0.2"]
        argvs = [[sys.executable, "-m", "tenantlab", "worker", "--name", f"w{i}",
                  "--events", str(tmp_path / f"w{i}.jsonl"), *common] for i in range(3)]
        argvs.append([sys.executable, "-m", "tenantlab", "reap", "--loop", "0.5", "--requeue",
                      "--grace", "1"])
        procs = []
        for a, log in zip(argvs, logs, strict=True):
            with log.open("w") as err:  # the child keeps its own copy of the descriptor
                procs.append(subprocess.Popen(a, env=env, stdout=subprocess.DEVNULL, stderr=err))
        try:
            for restart in range(2):
                deadline = time.monotonic() + 60
                while settled(s)[0] < 150 * (restart + 1):
                    assert time.monotonic() < deadline, "the workers made no progress"
                    assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
                    time.sleep(0.1)
                crash_stop(server)
                time.sleep(1.0)  # down for a while: every process sees connections refused
                assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
                server.up(port=port)
            deadline = time.monotonic() + 120
            while (done := settled(s))[0] != done[1]:
                assert time.monotonic() < deadline, f"jobs never settled: {done}"
                assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
                time.sleep(0.2)
            assert all(p.poll() is None for p in procs), "a worker or the reaper exited"
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            codes = []
            for p in procs:
                try:
                    codes.append(p.wait(timeout=30))
                except subprocess.TimeoutExpired:
                    p.kill()
                    codes.append(p.wait())
        assert codes == [0, 0, 0, 0], [log.read_text()[-800:] for log in logs]
        with s.connect("admin", "test restart", autocommit=True) as c:
            states = dict(c.execute("select status, count(*) from jobs group by status").fetchall())
            over = c.execute("select count(*) from jobs where attempts > max_attempts").fetchone()[0]
        assert states == {"done": 600, "dead": 3}, states
        assert over == 0
        for log in logs:
            text = log.read_text()
            # One line per outage (two restarts), not one per failed reconnection.
            assert 1 <= text.count("lost the server") <= 2, text[-1500:]
            assert "Traceback" not in text, text[-1500:]
