"""Read every environment variable the kit honours, here and nowhere else.

Each function reads the environment when called (not at import), so a test or a notebook that
sets a variable sees it take effect. The README's "Environment variables" table lists them all.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import TenantlabError

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


def _get(name: str) -> str | None:
    return os.environ.get(name) or None


def database_url() -> str | None:
    """Return the outside server's admin URL: TENANTLAB_DATABASE_URL, or DATABASE_URL when told to.

    A shell-wide DATABASE_URL usually belongs to someone's own application: the kit creates
    roles and databases on its server only when TENANTLAB_USE_DATABASE_URL=1 says so.
    """
    if url := _get(DATABASE_URL):
        return url
    if _get(USE_DATABASE_URL) in ("1", "true", "yes") and (url := _get("DATABASE_URL")):
        return url
    return None


def ignored_database_url() -> bool:
    """Return True when a bare DATABASE_URL is set but not used (worth one line of notice)."""
    return bool(_get("DATABASE_URL")) and database_url() is None


def home() -> Path | None:
    """Return TENANTLAB_HOME, the embedded server's state directory, when set."""
    return Path(env).resolve() if (env := _get(HOME)) else None


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
        raise TenantlabError(f"{PORT} must be a port number, not {text!r}") from None
    if not 1024 <= value <= 65535:
        raise TenantlabError(f"{PORT} must be from 1024 to 65535, not {value}")
    return value


def pg_bindir() -> Path | None:
    """Return TENANTLAB_PG_BINDIR (a directory with pg_ctl and postgres) when set."""
    return Path(env) if (env := _get(PG_BINDIR)) else None


def size() -> str:
    """Return TENANTLAB_SIZE: "workshop" (default) or "full" (the article's sizes)."""
    return _get(SIZE) or "workshop"


def dsn() -> str | None:
    """Return TENANTLAB_DSN, the database a worker process works on, when set."""
    return _get(DSN)


def notebooks() -> Path | None:
    """Return TENANTLAB_NOTEBOOKS, the notebooks directory `lab` opens, when set."""
    return Path(env) if (env := _get(NOTEBOOKS)) else None


def sql_dir() -> Path | None:
    """Return TENANTLAB_SQL, a directory of .sql files to load instead of the package's."""
    return Path(env) if (env := _get(SQL)) else None


def worker_password() -> str | None:
    """Return TENANTLAB_WORKER_PASSWORD, a chosen password for tenantlab_worker, when set."""
    return _get(WORKER_PASSWORD)


def outside_file() -> Path | None:
    """Return TENANTLAB_OUTSIDE, the outside world's file, when set."""
    return Path(env) if (env := _get(OUTSIDE)) else None


def outside_hang() -> str:
    """Return TENANTLAB_OUTSIDE_HANG as text ("" when unset); the caller parses it."""
    return _get(OUTSIDE_HANG) or ""


def jupyter_token() -> str | None:
    """Return JUPYTER_TOKEN when set (the lab's token; otherwise a random one)."""
    return _get(JUPYTER_TOKEN)


def path() -> str:
    """Return PATH for the server's child processes."""
    return _get("PATH") or "/usr/bin:/bin"


def pgbouncer() -> Path | None:
    """Return the pgbouncer binary to use instead of the one on PATH (TENANTLAB_PGBOUNCER)."""
    return Path(v) if (v := _get(PGBOUNCER)) else None


def pgbouncer_url() -> str | None:
    """Return a PgBouncer to use as it is (TENANTLAB_PGBOUNCER_URL; docker compose sets it)."""
    return _get(PGBOUNCER_URL)


def probe_dsn() -> str | None:
    """Return the DSN a vanish probe inside a network namespace connects to (set by its parent)."""
    return _get(PROBE_DSN)


def exercises_file() -> Path | None:
    """Return TENANTLAB_EXERCISES, the file that keeps exercise progress, when set."""
    return Path(env) if (env := _get(EXERCISES)) else None


def solutions() -> bool:
    """Return True when TENANTLAB_SOLUTIONS asks for the exercises' solutions expanded."""
    return _get(SOLUTIONS) in ("1", "true", "yes")
