"""jobqueue behind a transaction pooler, on a read-only server, and started before its server
(issue 31, item 4 and the outages at start): worker processes as an application runs them,
through a real PgBouncer in transaction mode, as the README's worker role."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import HERE, Scratch
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobqueue import enqueue as put

PGBOUNCER = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/bin")
needs_pgbouncer = pytest.mark.skipif(PGBOUNCER is None, reason="no pgbouncer on this machine "
                                     "(apt install pgbouncer / brew install pgbouncer)")
ENV = dict(os.environ, PYTHONPATH=str(HERE))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Bouncer:
    port: int
    log: Path

    def through(self, dsn: str) -> str:
        """`dsn` rerouted through the pooler: same database, user and password."""
        return make_conninfo(dsn, host="127.0.0.1", port=str(self.port))


@contextlib.contextmanager
def pgbouncer(scratch: Scratch, pool_size: int = 3, port: int | None = None) -> Iterator[Bouncer]:
    """A PgBouncer in transaction mode (PgBouncer's defaults otherwise) for the worker role,
    `pool_size` server sessions for it, listening on `port` (default: a free one)."""
    assert PGBOUNCER is not None
    target = conninfo_to_dict(scratch.admin)
    worker = conninfo_to_dict(scratch.worker)
    home = Path(tempfile.mkdtemp(prefix="jobqueue-test-pgbouncer-"))
    port = port or _free_port()
    (home / "users.txt").write_text(f'"{worker["user"]}" "{worker["password"]}"\n')
    (home / "pgbouncer.ini").write_text("\n".join([
        "[databases]", f"* = host={target.get('host') or '127.0.0.1'} "
                       f"port={target.get('port') or 5432}",
        "[pgbouncer]", "listen_addr = 127.0.0.1", f"listen_port = {port}", "unix_socket_dir =",
        "auth_type = scram-sha-256", f"auth_file = {home / 'users.txt'}",
        "pool_mode = transaction", f"default_pool_size = {pool_size}", f"logfile = {home / 'log'}", ""]))
    # PgBouncer refuses to run as root.
    as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    if as_user:
        for path in (home, home / "users.txt", home / "pgbouncer.ini"):
            shutil.chown(path, "nobody")
    proc = subprocess.Popen([*as_user, PGBOUNCER, str(home / "pgbouncer.ini")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "pgbouncer did not start listening"
                time.sleep(0.05)
        yield Bouncer(port, home / "log")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
        shutil.rmtree(home, ignore_errors=True)


class Workers:
    """Worker processes (``python -m jobqueue``), each with its log; ended on the way out."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs = tmp, []  # type: ignore[var-annotated]

    def start(self, dsn: str, *flags: str) -> subprocess.Popen:  # type: ignore[type-arg]
        log = open(self.tmp / f"worker-{len(self.procs)}.log", "w+")  # noqa: SIM115
        p = subprocess.Popen([sys.executable, "-m", "jobqueue", "--handlers", "pooler_handlers",
                              "--dsn", dsn, *flags], stdout=log, stderr=subprocess.STDOUT,
                             env=ENV, text=True)
        p.log = log  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def output(self, p: subprocess.Popen) -> str:
        p.log.flush()  # type: ignore[attr-defined]
        return Path(p.log.name).read_text()  # type: ignore[attr-defined]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            p.log.close()  # type: ignore[attr-defined]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path)
    try:
        yield w
    finally:
        w.close()


@pytest.fixture
def conn(scratch: Scratch) -> Iterator[psycopg.Connection]:
    with scratch.connect("worker", "test pooler", autocommit=True) as c:
        yield c


def _wait(until: Any, timeout: float, *procs: subprocess.Popen) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if until():
            return True
        if procs and any(p.poll() is not None for p in procs):
            return bool(until())
        time.sleep(0.1)
    return bool(until())


def _jobs(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
    return conn.execute("select id, status, attempts, last_error from jobqueue.jobs "
                        "order by id").fetchall()


def _all_done(conn: psycopg.Connection) -> bool:
    return all(status == "done" for _, status, _, _ in _jobs(conn))


def _queue(conn: psycopg.Connection) -> None:
    """Enough statements for psycopg to prepare (it does after 5 runs of one query on a
    connection): 30 short jobs, and two that sleep long enough for a few beats each."""
    for i in range(30):
        put(conn, "noop", tenant=1 + i % 5)
    for t in (6, 7):
        put(conn, "sleep", tenant=t, payload={"seconds": 2.5})


@needs_pgbouncer
def test_pooler_mode_runs_every_job_once_through_pgbouncer(scratch: Scratch, conn,
                                                           workers: Workers) -> None:
    """Two workers, their heartbeats and claims through PgBouncer in transaction mode with
    ``--pooler``: every job done at its first attempt, no worker exits, nothing prepared.
    One serves two queues: its claim is another statement than the other's."""
    _queue(conn)
    flags = ("--pooler", "--lease", "1.5", "--poll", "0.2")
    with pgbouncer(scratch, pool_size=3) as bouncer:
        procs = [workers.start(bouncer.through(scratch.worker), *flags),
                 workers.start(bouncer.through(scratch.worker), *flags, "--queues",
                               "default,slow")]
        _check_all_done_once(conn, workers, procs)


def _check_all_done_once(conn: psycopg.Connection, workers: Workers,
                         procs: list[subprocess.Popen]) -> None:  # type: ignore[type-arg]
    assert _wait(lambda: _all_done(conn), 60, *procs), (_jobs(conn), workers.output(procs[0]))
    assert [p.poll() for p in procs] == [None, None], [workers.output(p) for p in procs]
    assert {(s, a) for _, s, a, _ in _jobs(conn)} == {("done", 1)}
    for p in procs:
        assert "prepared statement" not in workers.output(p)


@needs_pgbouncer
def test_without_pooler_mode_the_worker_says_so_in_one_line(scratch: Scratch, conn,
                                                           workers: Workers) -> None:
    """The same through PgBouncer without ``--pooler``, one server session for both (so the
    clash is certain, not a matter of which session the pooler hands out): psycopg's prepared
    statements meet each other's. A worker that meets the clash stops (exit 2) with one line
    that says to use --pooler, instead of failing jobs or trying again; no job is failed or
    dead for it."""
    for i in range(30):
        put(conn, "noop", tenant=1 + i % 5)
    flags = ("--lease", "5", "--poll", "0.05")
    with pgbouncer(scratch, pool_size=1) as bouncer:
        procs = [workers.start(bouncer.through(scratch.worker), *flags) for _ in range(2)]
        _wait(lambda: any(p.poll() is not None for p in procs), 30)
    outs = [workers.output(p) for p in procs]
    stopped = [(p.returncode, out) for p, out in zip(procs, outs, strict=True)
               if p.returncode is not None]
    assert stopped, outs
    for code, out in stopped:
        assert code == 2 and "--pooler" in out and "Traceback" not in out, out
        assert len(out.strip().splitlines()) == 1, out
    assert not [j for j in _jobs(conn) if j[1] == "dead" or "_pg3_" in (j[3] or "")], _jobs(conn)
    assert not [j for j in _jobs(conn) if j[1] in ("dead", "failed") or
                "prepared statement" in (j[3] or "")], _jobs(conn)


@needs_pgbouncer
def test_pooler_mode_wakes_from_a_direct_listen_connection(scratch: Scratch, conn,
                                                          workers: Workers) -> None:
    """Through the pooler a LISTEN is never heard; ``--listen-dsn`` listens on a direct
    connection: a job queued while the worker idles runs long before its poll (10 minutes)."""
    with pgbouncer(scratch) as bouncer:
        p = workers.start(bouncer.through(scratch.worker), "--pooler", "--poll", "600",
                          "--listen-dsn", scratch.worker)
        with scratch.connect("admin", autocommit=True) as admin:
            assert _wait(lambda: admin.execute(
                "select count(*) from pg_stat_activity where datname = current_database() and "
                "application_name like '% listen' and state = 'idle'").fetchone() == (1,), 30, p)
        time.sleep(0.5)  # idle: its first claim found nothing, it waits
        job = put(conn, "noop", tenant=1)
        assert _wait(lambda: _jobs(conn)[0][1] == "done", 60, p), (_jobs(conn), workers.output(p))
        assert p.poll() is None and job == _jobs(conn)[0][0]


def test_a_read_only_server_is_an_outage_with_a_limit(scratch: Scratch, workers: Workers) -> None:
    """A DSN that reaches a server that takes no writes (a hot standby; here the closest cheap
    equivalent, ``default_transaction_read_only`` on the database, which a standby's sessions
    share: every write fails with 25006) is an outage: one log line, backoff, and
    ``--max-outage`` ends it (exit 3), instead of reconnecting several times a second for ever."""
    with scratch.connect("admin", autocommit=True) as admin:
        admin.execute(sql.SQL("alter database {} set default_transaction_read_only = on").format(
            sql.Identifier(scratch.name)))
    p = workers.start(scratch.worker, "--max-outage", "3")
    try:
        p.wait(timeout=40)
    except subprocess.TimeoutExpired:
        pass  # judged below: still reconnecting is the defect
    out = workers.output(p)
    assert p.returncode == 3, out
    assert "default_transaction_read_only" in out and "Traceback" not in out, out
    assert len([ln for ln in out.splitlines() if "reconnecting" in ln]) == 1, out


def test_a_worker_started_before_its_server_waits_for_it(scratch: Scratch, conn,
                                                        workers: Workers) -> None:
    """Started while nothing listens where its DSN points (PostgreSQL still starting, say),
    with ``--max-outage 60``: the worker waits (one log line) instead of exiting 2, and runs
    jobs once the server is there. The server here is a PgBouncer started later on that port:
    a real server coming up where the worker waits."""
    port = _free_port()
    p = workers.start(make_conninfo(scratch.worker, host="127.0.0.1", port=str(port)),
                      "--pooler", "--max-outage", "60", "--poll", "0.2")
    time.sleep(2.0)
    assert p.poll() is None, workers.output(p)
    if PGBOUNCER is None:
        pytest.skip("no pgbouncer to start on the port the worker waits for")
    with pgbouncer(scratch, port=port):
        put(conn, "noop", tenant=1)
        assert _wait(lambda: _jobs(conn)[0][1] == "done", 60, p), (_jobs(conn),
                                                                   workers.output(p))
    out = workers.output(p)
    assert "cannot reach the server at start" in out and "for up to 60 s" in out, out
