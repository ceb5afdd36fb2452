"""Create and upgrade the queue's schema: numbered migrations, each applied once, in order.

``migrations/NNNN_name.sql`` are applied by ``migrate`` in one transaction under an advisory
lock (workers and deploys started together cannot trip over each other), each recorded in
``jobqueue.migrations``. The first install chooses the tenant key's type (the domain
``jobqueue.tenant_id``: bigint, integer, uuid or text), matching the application's tenants.
``check`` is what a worker runs at start: the schema is there, not behind this package, and the
role may do what a worker does; otherwise one ``ConfigError`` that says what to do.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
from psycopg import sql

from .jobs import ConfigError
from .queries import q

__all__ = ["TENANT_TYPES", "available", "check", "latest", "migrate"]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
TENANT_TYPES = ("bigint", "integer", "uuid", "text")
_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


def available() -> list[tuple[int, str, Path]]:
    """Return the package's migrations as (version, name, path), in order."""
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        m = _FILE.match(path.name)
        if m:
            found.append((int(m.group(1)), path.stem, path))
    return found


def latest() -> int:
    """Return the version this package's code expects the schema to be at."""
    return max(v for v, _, _ in available())


def migrate(conn: psycopg.Connection, tenant_type: str | None = None) -> list[str]:
    """Apply the migrations not applied yet, in order; return their names (empty: up to date).

    ``tenant_type`` (first install only; default bigint): the type of the application's tenant
    ids. Asking for another type than the installed one is an error (it needs a migration of
    the application's own).
    """
    if tenant_type is not None and tenant_type not in TENANT_TYPES:
        raise ConfigError(f"tenant type must be one of {', '.join(TENANT_TYPES)}, "
                          f"not {tenant_type!r}")
    applied: list[str] = []
    with conn.transaction():
        conn.execute(q("migrate_lock"))
        conn.execute(q("migrations_bootstrap"))
        row = conn.execute(q("tenant_type_of")).fetchone()
        if row is None:
            conn.execute(sql.SQL("create domain jobqueue.tenant_id as {}").format(
                sql.SQL(tenant_type or "bigint")))  # one of TENANT_TYPES, checked above
        elif tenant_type is not None and row[0] != tenant_type:
            raise ConfigError(f"jobqueue is installed with {row[0]} tenant ids, not "
                              f"{tenant_type}: changing it is a migration of your own")
        done = {r[0] for r in conn.execute(q("migrations_applied")).fetchall()}
        for version, name, path in available():
            if version in done:
                continue
            conn.execute(path.read_text())  # type: ignore[arg-type,unused-ignore]  # our own file
            conn.execute(q("migration_record"), {"version": version, "name": name})
            applied.append(name)
    return applied


def check(conn: psycopg.Connection) -> None:
    """Refuse to work on a schema that is missing or behind, or without a worker's grants."""
    db = conn.info.dbname
    row = conn.execute(q("schema_state")).fetchone()
    installed, usage = row if row else (False, None)
    if not installed:
        raise ConfigError(f"database {db!r} has no jobqueue schema: run `migrate --dsn ...` as "
                          "the role that owns the queue's tables")
    if not usage:
        raise ConfigError(f"role {conn.info.user!r} lacks usage on schema jobqueue in database "
                          f"{db!r}: grant it (see the README's grants)")
    version = conn.execute(q("schema_version")).fetchone()
    if version is None or version[0] is None:
        raise ConfigError(f"database {db!r} has no jobqueue migration applied: run "
                          "`migrate --dsn ...` as the role that owns the queue's tables")
    if version[0] < latest():
        raise ConfigError(f"database {db!r} has the jobqueue schema at migration {version[0]}, "
                          f"this worker needs {latest()}: run `migrate --dsn ...` first")
    missing = [r[0] for r in conn.execute(q("missing_grants")).fetchall()]
    if missing:
        raise ConfigError(f"role {conn.info.user!r} lacks {', '.join(missing)} in database "
                          f"{db!r}: grant them (see the README's grants)")
