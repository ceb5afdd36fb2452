"""Start and stop a PgBouncer in transaction mode in front of the kit's PostgreSQL.

The binary is the system's (Debian's ``pgbouncer`` package, Homebrew's): the kit writes its own
ini and auth file into a directory of its own, listens on 127.0.0.1 on a free port, and points
a wildcard database entry at the server, so every database (a scratch one included) is reachable
through it. Only the worker role is in the auth file: what goes through the pooler is what a
worker does. PgBouncer refuses to run as root, so as root it runs as the embedded server's
unprivileged user.

``with running(admin_dsn) as bouncer:`` is what experiments use: the pooler always stops on the
way out, also on Ctrl-C, and its server connections end with it. ``start_daemon`` /
``stop_daemon`` serve ``tenantlab up --pgbouncer`` / ``tenantlab down``.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import db, settings
from .queries import q
from .server import ServerError, alive, embedded, free_port

log = logging.getLogger("tenantlab")

INSTALL = "pgbouncer is not installed: sudo apt install pgbouncer / brew install pgbouncer"
#: A PgBouncer someone else runs (docker compose's pooler service): used as it is, never started.
EXTERNAL = "TENANTLAB_PGBOUNCER_URL"
#: The first PgBouncer that keeps track of protocol-level prepared statements in transaction mode.
PREPARED_STATEMENTS_SINCE = (1, 21)


class PgBouncerMissing(ServerError):
    """No pgbouncer binary on this machine."""

    def __init__(self) -> None:
        super().__init__(INSTALL)


class PgBouncerError(ServerError):
    """PgBouncer would not start, or not stop."""


def binary() -> Path:
    """Return the pgbouncer binary (TENANTLAB_PGBOUNCER, PATH, /usr/sbin), or raise PgBouncerMissing."""
    if env := settings.pgbouncer():
        if env.is_file():
            return env
        raise PgBouncerMissing()
    # Debian puts it in /usr/sbin, which an ordinary user's PATH often lacks.
    found = shutil.which("pgbouncer") or shutil.which(
        "pgbouncer", path="/usr/sbin:/usr/local/sbin:/opt/homebrew/bin:/usr/local/bin")
    if not found:
        raise PgBouncerMissing()
    return Path(found)


def external_url() -> str | None:
    """Return the PgBouncer to use as it is (TENANTLAB_PGBOUNCER_URL; docker compose's), if any."""
    return settings.pgbouncer_url()


def installed() -> bool:
    """Return True when there is a PgBouncer to measure: an external one, or the binary."""
    if external_url():
        return True
    try:
        binary()
    except PgBouncerMissing:
        return False
    return True


@cache
def version() -> str:
    """Return the installed PgBouncer's version, e.g. '1.18.0'."""
    out = subprocess.run([str(binary()), "--version"], capture_output=True, text=True).stdout
    match = re.search(r"PgBouncer (\S+)", out)
    if not match:
        raise PgBouncerError(f"cannot read pgbouncer's version from {out.strip()[:80]!r}")
    return match.group(1)


def describe() -> str:
    """Return one line: which PgBouncer the kit runs, or how to install one."""
    if url := external_url():
        where = conninfo_to_dict(url)
        return (f"the PgBouncer at {where.get('host')}:{where.get('port')} ({EXTERNAL}), used as "
                "it is configured (docker compose: transaction mode, 2 server connections)")
    try:
        path = binary()
    except PgBouncerMissing as e:
        return f"{e} (notebook 12 and finding pgbouncer are skipped without it)"
    return (f"PgBouncer {version()} at {path}: the kit starts its own, in transaction mode, "
            "on 127.0.0.1, for the worker role")


def _run_as() -> pwd.struct_passwd | None:
    # The embedded server's user: created on first use, already there when the server runs.
    return embedded()._user()


@dataclass
class Config:
    """What the kit's PgBouncer does: transaction pooling, `pool_size` server connections per pair."""

    pool_size: int = 2
    pool_mode: str = "transaction"
    max_client_conn: int = 100
    #: PgBouncer 1.21+: prepared statements tracked per client; 0 (off) is the default there.
    max_prepared_statements: int | None = None


@dataclass
class PgBouncer:
    """A PgBouncer the kit started: where it listens, its files, and its process."""

    directory: Path | None
    host: str
    port: int
    admin_dsn: str
    proc: subprocess.Popen | None = None
    config: Config | None = None  # None: an external PgBouncer, configured by someone else

    def dsn(self, dbname: str = "postgres", user: str = db.WORKER, password: str | None = None) -> str:
        """Return a DSN that reaches database `dbname` through the pooler (as the worker role)."""
        pw = password if password is not None else db.worker_password(self.admin_dsn)
        return make_conninfo(host=self.host, port=str(self.port), dbname=dbname, user=user,
                             password=pw)

    def through(self, dsn: str) -> str:
        """Return `dsn` (a worker DSN) rerouted through the pooler: same database, user, password."""
        return make_conninfo(dsn, host=self.host, port=str(self.port))

    @property
    def external(self) -> bool:
        return self.config is None

    @property
    def logfile(self) -> Path | None:
        return self.directory / "pgbouncer.log" if self.directory else None

    def last_log_line(self) -> str:
        try:
            text = self.logfile.read_text() if self.logfile else ""
        except OSError:
            return "no log"
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return lines[-1] if lines else "empty log"

    def settings(self) -> dict[str, str]:
        """Return what PgBouncer's console says: its version and its configuration.

        The console takes the admin's name and password (the kit's own pooler lists the admin in
        ``admin_users``; docker compose's does too). Without them, what the kit configured.
        """
        console = make_conninfo(self.admin_dsn, host=self.host, port=str(self.port),
                                 dbname="pgbouncer")
        try:
            # The console speaks the simple query protocol only: a client-side-binding cursor.
            with psycopg.connect(console, autocommit=True, prepare_threshold=None,
                                 application_name=f"{db.APP} pgbouncer console") as conn:
                cur = psycopg.ClientCursor(conn)
                found = {str(k): str(v) for k, v, *_ in
                         cur.execute(q("pgbouncer_show_config")).fetchall()}
                row = cur.execute(q("pgbouncer_show_version")).fetchone()
                found["version"] = str(row[0]).removeprefix("PgBouncer ") if row else ""
                return found
        except psycopg.Error:
            if self.config is None:
                raise
        c = self.config
        return {"version": version(), "pool_mode": c.pool_mode,
                "default_pool_size": str(c.pool_size),
                "max_prepared_statements": str(c.max_prepared_statements or 0)}


def write_files(directory: Path, admin_dsn: str, port: int, config: Config,
                user: pwd.struct_passwd | None, *, daemon: bool = False) -> Path:
    """Write pgbouncer.ini and the auth file into `directory`; return the ini's path."""
    target = conninfo_to_dict(admin_dsn)
    host = str(target.get("host") or "127.0.0.1")
    server_port = str(target.get("port") or 5432)
    auth = directory / "userlist.txt"
    # The worker's password in clear: PgBouncer needs it to log in to PostgreSQL with SCRAM.
    users = {db.WORKER: db.worker_password(admin_dsn)}
    # The admin may open PgBouncer's console (SHOW CONFIG), as on docker compose's pooler.
    admin = str(target.get("user") or "")
    if admin and target.get("password"):
        users[admin] = str(target["password"])
    auth.write_text("".join(f'"{u}" "{pw}"\n' for u, pw in users.items()))
    lines = [
        "[databases]",
        # Any database name a client asks for, on the kit's server: scratch databases come and go.
        f"* = host={host} port={server_port}",
        "",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = scram-sha-256",
        f"auth_file = {auth}",
        f"pool_mode = {config.pool_mode}",
        f"default_pool_size = {config.pool_size}",
        "min_pool_size = 0",
        "reserve_pool_size = 0",
        f"max_client_conn = {config.max_client_conn}",
        # LIFO (PgBouncer's default), stated: the most recently used server connection goes first.
        "server_round_robin = 0",
        f"admin_users = {admin or db.WORKER}",
        f"logfile = {directory / 'pgbouncer.log'}",
        f"pidfile = {directory / 'pgbouncer.pid'}" if daemon else "",
        "log_connections = 0",
        "log_disconnections = 0",
    ]
    if config.max_prepared_statements is not None:
        lines.append(f"max_prepared_statements = {config.max_prepared_statements}")
    ini = directory / "pgbouncer.ini"
    ini.write_text("\n".join(lines) + "\n")
    for path in (directory, auth, ini):
        path.chmod(0o700 if path.is_dir() else 0o600)
        if user is not None:
            os.chown(path, user.pw_uid, user.pw_gid)
    return ini


def _spawn(ini: Path, user: pwd.struct_passwd | None, *, daemon: bool) -> subprocess.Popen:
    kw: dict = {}
    if user is not None:
        kw = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    cmd = [str(binary()), *(["-d"] if daemon else []), str(ini)]
    # stderr to a file, not a pipe: in the foreground it logs there too, and nobody reads a pipe.
    with open(ini.parent / "stderr.log", "w") as err:
        # Its own session: a Ctrl-C in a notebook or terminal reaches us, and we stop it in order.
        return subprocess.Popen(cmd, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True, **kw)


def _startup_error(bouncer: PgBouncer) -> str:
    try:
        text = (bouncer.directory / "stderr.log").read_text() if bouncer.directory else ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
    except OSError:
        lines = []
    return lines[-1] if lines else bouncer.last_log_line()


def _wait_listening(bouncer: PgBouncer, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _listening(bouncer.host, bouncer.port):
            return
        proc = bouncer.proc
        if proc is not None and proc.poll() is not None and proc.returncode != 0:
            raise PgBouncerError(f"pgbouncer did not start: {_startup_error(bouncer)}")
        time.sleep(0.02)
    raise PgBouncerError(f"pgbouncer not listening on port {bouncer.port} after {timeout:g} s: "
                         f"{bouncer.last_log_line()}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        # SIGTERM: immediate shutdown (SIGINT would wait for clients to leave).
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def running(admin_dsn: str | None = None, config: Config | None = None) -> Iterator[PgBouncer]:
    """Run a PgBouncer in front of the server for the block; stop it afterwards, whatever happens."""
    admin_dsn = admin_dsn or db.admin_dsn()
    config = config or Config()
    if url := external_url():
        # Someone else's pooler: nothing to start or stop, and its own configuration.
        where = conninfo_to_dict(url)
        yield PgBouncer(None, str(where.get("host") or "127.0.0.1"),
                        int(where.get("port") or 6432), admin_dsn)
        return
    binary()  # missing: say how to install it before anything else happens
    user = _run_as()
    with tempfile.TemporaryDirectory(prefix="tenantlab-pgbouncer-") as tmp:
        directory = Path(tmp)
        port = free_port()
        ini = write_files(directory, admin_dsn, port, config, user)
        bouncer = PgBouncer(directory, "127.0.0.1", port, admin_dsn, config=config)
        try:
            bouncer.proc = _spawn(ini, user, daemon=False)
            _wait_listening(bouncer)
            log.info("pgbouncer %s on 127.0.0.1:%s (pool %s, %s mode)", version(), port,
                     config.pool_size, config.pool_mode)
            yield bouncer
        finally:
            # Before the directory goes: its server connections end with the process.
            if bouncer.proc is not None:
                _stop(bouncer.proc)


# --- `tenantlab up --pgbouncer`: a daemon that outlives the command ---------------------------

def daemon_dir() -> Path:
    return embedded().home / "pgbouncer"


def daemon_pid() -> int | None:
    """Return the pid of the kit's daemon PgBouncer when it runs, None when not.

    Portable (macOS has no /proc), as the embedded server is found: the pid file's process must
    be alive and the port the kit gave it must accept a connection. A pid reused by another
    process after a crash fails the second test.
    """
    directory = daemon_dir()
    try:
        pid = int((directory / "pgbouncer.pid").read_text().split()[0])
        port = int((directory / "port").read_text())
    except (OSError, IndexError, ValueError):
        return None
    return pid if alive(pid) and _listening("127.0.0.1", port) else None


def _listening(host: str, port: int) -> bool:
    """Return True when something accepts a TCP connection on host:port (a bare connect)."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def start_daemon(admin_dsn: str, config: Config | None = None) -> tuple[PgBouncer, bool]:
    """Start the kit's PgBouncer in the background unless it runs; return it and whether we started it."""
    directory = daemon_dir()
    port_file = directory / "port"
    config = config or Config()
    if daemon_pid() is not None:
        return PgBouncer(directory, "127.0.0.1", int(port_file.read_text()), admin_dsn,
                         config=config), False
    binary()
    user = _run_as()
    directory.mkdir(parents=True, exist_ok=True)
    # Left by a daemon that died: PgBouncer would refuse to start if its pid is alive again.
    (directory / "pgbouncer.pid").unlink(missing_ok=True)
    port = free_port()
    ini = write_files(directory, admin_dsn, port, config, user, daemon=True)
    port_file.write_text(f"{port}\n")
    bouncer = PgBouncer(directory, "127.0.0.1", port, admin_dsn, config=config)
    proc = _spawn(ini, user, daemon=True)
    if proc.wait(timeout=10) != 0:
        raise PgBouncerError(f"pgbouncer did not start: {_startup_error(bouncer)}")
    _wait_listening(bouncer)
    return bouncer, True


def stop_daemon() -> bool:
    """Stop the kit's daemon PgBouncer; return True when it was running."""
    pid = daemon_pid()
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while daemon_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return True
