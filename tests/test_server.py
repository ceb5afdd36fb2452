"""The embedded server's lifecycle, its one-line errors, and the CLI around it."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tenantlab.server import SERVER_USER, Server, ServerError, bindir, free_port


@pytest.fixture
def home() -> Iterator[Path]:
    """A state directory the unprivileged server user can reach (not under /tmp/pytest-of-root)."""
    path = Path(tempfile.mkdtemp(prefix="tl-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    if (path / "data").exists():
        Server(path).down()
    shutil.rmtree(path, ignore_errors=True)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TENANTLAB_DATABASE_URL")}
    return env | extra


def cli(*args: str, env: dict[str, str] | None = None, user: int | None = None
        ) -> subprocess.CompletedProcess[str]:
    env = env or _env()
    return subprocess.run([sys.executable, "-m", "tenantlab", *args], capture_output=True,
                          text=True, env=env, timeout=180, user=user)


def test_up_status_down_via_cli(home: Path) -> None:
    env = _env(TENANTLAB_HOME=str(home))
    port = str(free_port())
    first = cli("up", "--port", port, env=env)
    assert first.returncode == 0, first.stderr
    dsn = first.stdout.strip().splitlines()[-1]
    assert dsn.startswith("postgresql://") and f":{port}/" in dsn
    with psycopg.connect(dsn) as conn:
        assert "PostgreSQL 17" in conn.execute("select version()").fetchone()[0]
    # Idempotent: a second `up` finds it running and prints the same DSN last.
    again = cli("up", env=env)
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == dsn
    assert "already running" in again.stderr
    assert cli("status", env=env).returncode == 0
    assert cli("down", env=env).stdout.strip() == "stopped"
    assert cli("down", env=env).stdout.strip() == "not running"
    assert cli("status", env=env).returncode == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="the root case needs root")
def test_as_root_the_server_runs_as_an_unprivileged_user(home: Path) -> None:
    server = Server(home)
    assert server.up(port=free_port())
    try:
        owner = Path(f"/proc/{server.pid()}").stat().st_uid
        assert pwd.getpwuid(owner).pw_name == SERVER_USER
        assert pwd.getpwuid((home / "data").stat().st_uid).pw_name == SERVER_USER
        assert server.up() is False  # found running: not started again
    finally:
        assert server.down()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to a normal user needs root")
def test_as_a_normal_user_the_server_runs_as_that_user(home: Path) -> None:
    """Fork, become the unprivileged user, and run up/down there: no user switch happens."""
    Server(home)._user()  # creates the user if needed
    user = pwd.getpwnam(SERVER_USER)
    if subprocess.run(["test", "-x", str(bindir() / "postgres")], user=user.pw_uid).returncode:
        pytest.skip(f"the PostgreSQL binaries are not reachable by {SERVER_USER}")
    os.chown(home, user.pw_uid, user.pw_gid)
    port = free_port()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: a normal user from here on
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            server = Server(home)
            started = server.up(port=port)
            owner = Path(f"/proc/{server.pid()}").stat().st_uid
            with psycopg.connect(server.dsn()) as conn:
                major = conn.execute("show server_version_num").fetchone()[0][:2]
            stopped = server.down()
            os.write(write, f"{started} {owner} {major} {stopped}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read().split()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child failed: see the captured output"
    assert report == ["True", str(user.pw_uid), "17", "True"]


def test_port_taken_is_a_one_line_error(home: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match=rf"^port {port} on 127.0.0.1 is taken"):
            Server(home).up(port=port)


def test_a_socket_path_too_long_is_refused_before_anything_is_made() -> None:
    deep = Path("/tmp") / ("d" * 100) / "home"
    with pytest.raises(ServerError, match=r"socket path .* bytes, more than the 10[37]"):
        Server(deep).up(port=free_port())
    assert not deep.parent.exists()  # refused before initdb made anything


def test_a_home_with_a_space_in_its_path_starts() -> None:
    home = Path(tempfile.mkdtemp(prefix="tl space ", dir="/tmp"))
    home.chmod(0o755)
    server = Server(home)
    try:
        server.up(port=free_port())
        with psycopg.connect(server.dsn()) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    finally:
        server.down()
        shutil.rmtree(home, ignore_errors=True)


def test_stale_pid_file_is_removed_and_the_server_starts(home: Path, caplog) -> None:
    server = Server(home)
    server.up(port=free_port())
    server.down()
    # A pid file left by a crash, naming a process that is not postgres (our own pid).
    (home / "data" / "postmaster.pid").write_text(f"{os.getpid()}\n{home / 'data'}\n")
    assert server.stale_pidfile() == os.getpid()
    assert server.up()
    try:
        assert "stale pid file" in caplog.text
    finally:
        server.down()


def test_data_directory_from_another_major_version(home: Path) -> None:
    server = Server(home)
    server.up(port=free_port())
    server.down()
    (home / "data" / "PG_VERSION").write_text("15\n")
    with pytest.raises(ServerError, match=r"is from PostgreSQL 15, the binaries are 17"):
        server.up()


def test_binaries_missing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENANTLAB_PG_BINDIR", str(home / "nowhere"))
    with pytest.raises(ServerError, match=r"^postgresql binaries missing"):
        Server(home).up(port=free_port())
    env = _env(TENANTLAB_HOME=str(home))
    done = cli("up", env=env)
    assert done.returncode == 2  # a variable naming no binaries: bad input
    assert done.stderr.strip().count("\n") == 0 and "binaries missing" in done.stderr


def test_bad_arguments_say_what_is_valid() -> None:
    done = cli("up", "--port", "80")
    assert done.returncode == 2 and "from 1024 to 65535" in done.stderr
    done = cli("frobnicate")
    assert done.returncode == 2 and "choose from" in done.stderr


def test_reproduce_rejects_unknown_ids(admin_dsn: str) -> None:
    done = cli("reproduce", "no-such-finding", env=dict(os.environ, TENANTLAB_DATABASE_URL=admin_dsn))
    assert done.returncode == 2
    assert "unknown finding no-such-finding; valid ids:" in done.stderr


def test_restart_right_after_stop_reuses_the_port(home: Path) -> None:
    """Connections in TIME_WAIT from the server just stopped must not make the port 'taken'."""
    server = Server(home)
    port = free_port()
    server.up(port=port)
    for _ in range(3):
        with psycopg.connect(server.dsn()) as conn:
            conn.execute("select 1")
    server.down()
    try:
        assert server.up() is True and server.port() == port
    finally:
        server.down()
