"""Read every environment variable the kit honours, here and nowhere else.

Each function reads the environment when called (not at import), so a test or a notebook that
sets a variable sees it take effect. The README's "Environment variables" table lists them all.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from jobqueue import MAX_SECONDS, ConfigError, check_dsn

from .errors import ConfigurationError
from .errors import TenantlabError as TenantlabError  # settings.TenantlabError, as before

#: The kit's own variable for an outside server's admin URL.
DATABASE_URL = "TENANTLAB_DATABASE_URL"
#: Set to 1 to let a bare DATABASE_URL stand in for TENANTLAB_DATABASE_URL.
USE_DATABASE_URL = "TENANTLAB_USE_DATABASE_URL"
HOME = "TENANTLAB_HOME"
PORT = "TENANTLAB_PORT"
PG_BINDIR = "TENANTLAB_PG_BINDIR"
SIZE = "TENANTLAB_SIZE"
DSN = "TENANTLAB_DSN"
NOTEBOOKS = "TENANTLAB_NOTEBOOKS"
SQL = "TENANTLAB_SQL"
WORKER_PASSWORD = "TENANTLAB_WORKER_PASSWORD"
OUTSIDE = "TENANTLAB_OUTSIDE"
OUTSIDE_HANG = "TENANTLAB_OUTSIDE_HANG"
JUPYTER_TOKEN = "JUPYTER_TOKEN"
PGBOUNCER = "TENANTLAB_PGBOUNCER"
PGBOUNCER_URL = "TENANTLAB_PGBOUNCER_URL"
PROBE_DSN = "TENANTLAB_PROBE_DSN"
EXERCISES = "TENANTLAB_EXERCISES"
SOLUTIONS = "TENANTLAB_SOLUTIONS"
#: The sizes TENANTLAB_SIZE names, written exactly so.
SIZES = ("workshop", "full")
_YES, _NO = ("1", "true", "yes"), ("0", "false", "no")


def _get(name: str) -> str | None:
    return os.environ.get(name) or None


def _dsn(name: str, value: str | None) -> str | None:
    """Return `value` when it is a connection string; a ConfigurationError naming `name` if not."""
    if value is None:
        return None
    try:
        return check_dsn(value, name)
    except ConfigError as e:
        raise ConfigurationError(str(e)) from None


def _directory(name: str, value: str | None, *, must_exist: bool = False) -> Path | None:
    """Return the path in `value`; refuse a file (or, when `must_exist`, nothing) there."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigurationError(f"{name}={value} is a file, not a directory")
    if must_exist and not path.is_dir():
        raise ConfigurationError(f"{name}={value} does not exist: it must name a directory")
    return path


def check() -> None:
    """Read every variable once: a bad one is a ConfigurationError before anything starts.

    The CLI calls this first, so `TENANTLAB_SIZE=Full tenantlab lab` fails at once and not in
    a kernel later.
    """
    database_url()
    home()
    port()
    pg_bindir()
    size()
    dsn()
    notebooks()
    sql_dir()
    outside_file()
    outside_hang()
    pgbouncer_url()
    exercises_file()
    solutions()


def database_url() -> str | None:
    """Return the outside server's admin URL: TENANTLAB_DATABASE_URL, or DATABASE_URL when told to.

    A shell-wide DATABASE_URL usually belongs to someone's own application: the kit creates
    roles and databases on its server only when TENANTLAB_USE_DATABASE_URL=1 says so.
    """
    if url := _get(DATABASE_URL):
        return _dsn(DATABASE_URL, url)
    use = (_get(USE_DATABASE_URL) or "0").lower()
    if use not in _YES + _NO:
        raise ConfigurationError(f"{USE_DATABASE_URL} must be 1 or 0 (true/false, yes/no), "
                                 f"not {_get(USE_DATABASE_URL)!r}")
    if use in _YES and (url := _get("DATABASE_URL")):
        return _dsn(f"DATABASE_URL (used as {USE_DATABASE_URL}=1 says)", url)
    return None


def ignored_database_url() -> bool:
    """Return True when a bare DATABASE_URL is set but not used (worth one line of notice)."""
    return bool(_get("DATABASE_URL")) and not _get(DATABASE_URL) and \
        (_get(USE_DATABASE_URL) or "0").lower() not in _YES


def home() -> Path | None:
    """Return TENANTLAB_HOME, the embedded server's state directory, when set."""
    path = _directory(HOME, _get(HOME))
    return path.resolve() if path else None


def state_home() -> Path:
    """Return XDG_STATE_HOME (default ~/.local/state): where an installed kit keeps its state."""
    return Path(_get("XDG_STATE_HOME") or Path.home() / ".local" / "state")


def port() -> int | None:
    """Return TENANTLAB_PORT, the embedded server's port, when set."""
    text = _get(PORT)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigurationError(f"{PORT} must be a port number, not {text!r}") from None
    if not 1024 <= value <= 65535:
        raise ConfigurationError(f"{PORT} must be from 1024 to 65535, not {value}")
    return value


def pg_bindir() -> Path | None:
    """Return TENANTLAB_PG_BINDIR (a directory with pg_ctl and postgres) when set."""
    return _directory(PG_BINDIR, _get(PG_BINDIR))  # its binaries: server.bindir() checks


def size() -> str:
    """Return TENANTLAB_SIZE: "workshop" (default) or "full" (the article's sizes), exactly."""
    value = _get(SIZE) or "workshop"
    if value not in SIZES:
        raise ConfigurationError(f"{SIZE} must be {' or '.join(SIZES)} (in lower case), "
                                 f"not {value!r}")
    return value


def dsn() -> str | None:
    """Return TENANTLAB_DSN, the database a worker process works on, when set."""
    return _dsn(DSN, _get(DSN))


def notebooks() -> Path | None:
    """Return TENANTLAB_NOTEBOOKS, the notebooks directory `lab` opens, when set."""
    return _directory(NOTEBOOKS, _get(NOTEBOOKS), must_exist=True)


def sql_dir() -> Path | None:
    """Return TENANTLAB_SQL, a directory of .sql files to load instead of the package's."""
    path = _directory(SQL, _get(SQL), must_exist=True)
    if path is not None and not (path / "lab").is_dir():
        raise ConfigurationError(f"{SQL}={path} has no lab/ directory: it must name a copy of "
                                 "the checkout's sql/")
    return path


def worker_password() -> str | None:
    """Return TENANTLAB_WORKER_PASSWORD, a chosen password for tenantlab_worker, when set."""
    return _get(WORKER_PASSWORD)


def outside_file() -> Path | None:
    """Return TENANTLAB_OUTSIDE, the outside world's file, when set."""
    if (env := _get(OUTSIDE)) is None:
        return None
    path = Path(env).expanduser()
    if path.is_dir():
        raise ConfigurationError(f"{OUTSIDE}={env} is a directory: it must name a file")
    if not path.parent.is_dir():
        raise ConfigurationError(f"{OUTSIDE}={env}: its directory {path.parent} does not exist")
    return path


def outside_hang() -> str:
    """Return TENANTLAB_OUTSIDE_HANG as text ("" when unset); the caller parses it."""
    text = _get(OUTSIDE_HANG) or ""
    try:
        value = float(text or "0")
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= MAX_SECONDS):
        raise ConfigurationError(f"{OUTSIDE_HANG} must be a number of seconds from 0 to "
                                 f"{MAX_SECONDS:,}, not {text!r}")
    return text


def jupyter_token() -> str | None:
    """Return JUPYTER_TOKEN when set (the lab's token; otherwise a random one)."""
    return _get(JUPYTER_TOKEN)


def path() -> str:
    """Return PATH for the server's child processes."""
    return _get("PATH") or "/usr/bin:/bin"


def pgbouncer() -> Path | None:
    """Return the pgbouncer binary to use instead of the one on PATH (TENANTLAB_PGBOUNCER)."""
    # Not checked here: a missing binary is the finding's "skipped: not installed".
    return Path(v) if (v := _get(PGBOUNCER)) else None


def pgbouncer_url() -> str | None:
    """Return a PgBouncer to use as it is (TENANTLAB_PGBOUNCER_URL; docker compose sets it)."""
    return _dsn(PGBOUNCER_URL, _get(PGBOUNCER_URL))


def probe_dsn() -> str | None:
    """Return the DSN a vanish probe inside a network namespace connects to (set by its parent)."""
    return _get(PROBE_DSN)


def exercises_file() -> Path | None:
    """Return TENANTLAB_EXERCISES, the file that keeps exercise progress, when set.

    An absolute path only: a kernel runs in notebooks/, a terminal anywhere, so a relative one
    would name a different file for each (and write into the checkout).
    """
    if not (env := _get(EXERCISES)):
        return None
    path = Path(env).expanduser()
    if not path.is_absolute():
        raise ConfigurationError(f"{EXERCISES}={env} is a relative path: give an absolute one "
                                 f"(e.g. {Path(env).resolve()}), since kernels and terminals "
                                 "run in different directories")
    if path.is_dir():
        raise ConfigurationError(f"{EXERCISES}={env} is a directory: it names the progress file")
    return path


def solutions() -> bool:
    """Return True when TENANTLAB_SOLUTIONS asks for the exercises' solutions expanded."""
    value = (_get(SOLUTIONS) or "0").lower()
    if value in ("on", "y"):
        value = "yes"
    if value in ("off", "n"):
        value = "no"
    if value not in _YES + _NO:
        raise ConfigurationError(f"{SOLUTIONS} must be 1 or 0 (true/false, yes/no, on/off), "
                                 f"not {_get(SOLUTIONS)!r}")
    return value in _YES
