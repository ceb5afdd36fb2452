"""Set-up that must work away from Linux and from one fixed address: no /proc, the worker's
password whatever the server's address, ports that do what their messages say."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tenantlab import db
from tenantlab.server import Server, free_port


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tl-port-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    if (path / "data").exists():
        Server(path).down()
    shutil.rmtree(path, ignore_errors=True)


def _hide_proc(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every Python-level look at /proc fail, as on macOS; return what was asked for."""
    asked: list[str] = []

    def guard(real):  # type: ignore[no-untyped-def]
        def wrapper(path, *args, **kwargs):  # type: ignore[no-untyped-def]
            if str(os.fspath(path) if not isinstance(path, int) else "").startswith("/proc"):
                asked.append(str(path))
                raise FileNotFoundError(errno.ENOENT, "no /proc here", str(path))
            return real(path, *args, **kwargs)
        return wrapper

    for mod, name in ((builtins, "open"), (io, "open"), (os, "stat"), (os, "listdir"),
                      (os, "scandir"), (os, "readlink")):
        monkeypatch.setattr(mod, name, guard(getattr(mod, name)))
    assert not Path("/proc/self/status").exists()  # the patch holds
    return asked


def test_process_checks_work_without_proc(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _hide_proc(monkeypatch)
    asked.clear()
    server = Server(home)
    assert server.up(port=free_port()) is True
    try:
        pid = server.pid()
        assert pid is not None and server.status()["running"]
        assert server.up() is False, "a running server read as stopped"
        assert (home / "data" / "postmaster.pid").exists(), "up removed a live server's pid file"
    finally:
        assert server.down() is True
    assert server.pid() is None and server.down() is False
    # A pid file left by a crash that names a live process which is not postgres (ours).
    (home / "data" / "postmaster.pid").write_text(f"{os.getpid()}\n{home / 'data'}\n")
    assert server.pid() is None and server.stale_pidfile() == os.getpid()
    assert server.up() is True
    assert server.down() is True
    assert asked == [], f"read /proc: {asked}"


def test_pgbouncer_daemon_is_found_without_proc(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`up --pgbouncer`'s daemon: a live pid is not enough, its port must answer (no /proc)."""
    from tenantlab import pgbouncer

    monkeypatch.setattr(pgbouncer, "daemon_dir", lambda: tmp_path)
    asked = _hide_proc(monkeypatch)
    asked.clear()
    assert pgbouncer.daemon_pid() is None  # no pid file
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        (tmp_path / "port").write_text(f"{listener.getsockname()[1]}\n")
        # A live process (this one) that does not listen there: a pid reused after a crash.
        (tmp_path / "pgbouncer.pid").write_text(f"{os.getpid()}\n")
        assert pgbouncer.daemon_pid() is None
        listener.listen()
        assert pgbouncer.daemon_pid() == os.getpid()
        (tmp_path / "pgbouncer.pid").write_text("999999999\n")  # no such process
        assert pgbouncer.daemon_pid() is None
        assert pgbouncer.stop_daemon() is False
    assert asked == [], f"read /proc: {asked}"


def test_worker_password_does_not_depend_on_the_address(home: Path) -> None:
    server = Server(home)
    server.up(port=free_port())
    numeric = server.dsn()
    named = make_conninfo(numeric, host="localhost")
    assert conninfo_to_dict(named)["host"] == "localhost"
    assert db.worker_password(numeric) == db.worker_password(named)
    db.ensure_template(numeric)  # roles and password set through 127.0.0.1
    with psycopg.connect(make_conninfo(named, user=db.WORKER, password=db.worker_password(named))) as c:
        assert c.execute("select current_user").fetchone() == (db.WORKER,)
    # Another admin changed it: the next set-up (a new process) sets it again.
    with psycopg.connect(numeric, autocommit=True) as c:
        c.execute("alter role tenantlab_worker password 'someone-elses'")
    db._roles_ready.clear()
    db.ensure_template(named)
    with db.scratch("address", named) as s, s.connect("worker") as c:
        assert c.execute("select count(*) from jobs").fetchone() == (0,)


def test_tenantlab_port_wins_over_the_stored_port(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = Server(home)
    first, second = free_port(), free_port()
    server.up(port=first)
    server.down()
    monkeypatch.setenv("TENANTLAB_PORT", str(second))
    assert server.up() is True and server.port() == second
    try:
        with socket.socket() as taken:  # and when it is taken, the message names it
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            monkeypatch.setenv("TENANTLAB_PORT", str(taken.getsockname()[1]))
            server.down()
            with pytest.raises(Exception, match=r"is taken by another process.*TENANTLAB_PORT"):
                server.up()
    finally:
        server.down()


def test_lab_refuses_a_busy_port_before_printing_a_link(home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TENANTLAB_DATABASE_URL")}
    env |= {"TENANTLAB_HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / "jupyter")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "tenantlab", "lab", "--no-browser",
                               "--port", str(port)], capture_output=True, text=True, env=env,
                              timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"tenantlab lab: JupyterLab's port {port} on 127.0.0.1 is taken by another process: "
        "choose another with `tenantlab lab --port N` (`make lab PORT=N`)"]
    assert "token=" not in done.stdout + done.stderr
    assert not (home / "data").exists(), "the lab started PostgreSQL before checking its port"


def test_down_and_clean_refuse_while_a_lab_runs(home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TENANTLAB_DATABASE_URL")}
    env |= {"TENANTLAB_HOME": str(home)}
    server = Server(home)
    server.up(port=free_port())
    lab = subprocess.Popen(["sleep", "60"])  # stands in for a running `tenantlab lab`
    try:
        (home / "labs").mkdir()
        (home / "labs" / f"{lab.pid}-0.json").write_text(
            json.dumps({"pid": lab.pid, "jupyter": "127.0.0.1:8888"}))
        done = subprocess.run([sys.executable, "-m", "tenantlab", "down", "--purge"],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert (f"a lab still uses the server in {home}: pid {lab.pid} (JupyterLab on "
                "127.0.0.1:8888)") in done.stderr
        assert server.pid() is not None and (home / "data").exists()
    finally:
        lab.kill()
        lab.wait()
    # The lab gone (its marker left behind by a kill): the purge goes through.
    done = subprocess.run([sys.executable, "-m", "tenantlab", "down", "--purge"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not home.exists()


def test_a_live_pid_file_with_its_port_bound_is_not_deleted(home: Path) -> None:
    """A postgres starting or stopping: alive, not answering yet, its port bound. Keep its pid file."""
    server = Server(home)
    server.up(port=free_port())
    server.down()
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        bound.listen()
        port = bound.getsockname()[1]
        pidfile = home / "data" / "postmaster.pid"
        pidfile.write_text(f"{os.getpid()}\n{home / 'data'}\n0\n{port}\n{home / 'nowhere'}\n")
        with pytest.raises(Exception, match="seems to be starting or stopping"):
            server.up()
        assert pidfile.exists()
    pidfile.unlink()
