"""Create and upgrade the queue's schema: numbered migrations, each applied once, in order.

``migrations/NNNN_name.sql`` are applied by ``migrate`` in one transaction (online ones apart,
below) under an advisory lock (workers and deploys started together cannot trip over each
other), each recorded in ``jobqueue.migrations``. The first install chooses the tenant key's type (the domain
``jobqueue.tenant_id``: bigint, integer, uuid or text), matching the application's tenants.
``check`` is what a worker runs at start: the schema is there, neither behind this package nor
ahead of it, and the role may do what a worker does; otherwise one ``ConfigError`` that says
what to do.

Online: ``migrate`` takes its locks with a ``lock_timeout`` (2 s by default). A migration that
alters ``jobqueue.jobs`` needs that table to itself; waiting behind a running job's
transaction would make every enqueue of the application wait behind the migration. So it gives
up after the timeout (the transaction rolls back: nothing half done), waits a moment and tries
again, ``tries`` times, then stops with ``MigrationBlocked`` saying who holds the table. A
migration that builds an index is online (``ONLINE``): its statements run one by one outside
a transaction, ``create index concurrently``, so writes go on while the index is built.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql

from .jobs import ConfigError, JobQueueError
from .queries import q

log = logging.getLogger((__package__ or "jobqueue").split(".")[0])

__all__ = ["LOCK_TIMEOUT", "LOCK_TRIES", "TENANT_TYPES", "MigrationBlocked", "available",
           "check", "latest", "migrate"]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
TENANT_TYPES = ("bigint", "integer", "uuid", "text")
_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")
#: How long ``migrate`` waits for one lock (seconds): the longest an enqueue waits behind it.
LOCK_TIMEOUT = 2.0
#: How many times ``migrate`` tries before it gives up.
LOCK_TRIES = 5
#: The line that makes a migration online: its statements run one by one, outside a
#: transaction (``create index concurrently``).
ONLINE = "-- jobqueue: online"


class MigrationBlocked(JobQueueError):
    """``migrate`` could not take its locks within its lock timeout, try after try."""


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


def migrate(conn: psycopg.Connection, tenant_type: str | None = None, *,
            lock_timeout: float = LOCK_TIMEOUT, tries: int = LOCK_TRIES,
            sleep: Callable[[float], object] = time.sleep) -> list[str]:
    """Apply the migrations not applied yet, in order; return their names (empty: up to date).

    ``tenant_type`` (first install only; default bigint): the type of the application's tenant
    ids. Asking for another type than the installed one is an error (it needs a migration of
    the application's own).
    """
    if tenant_type is not None and tenant_type not in TENANT_TYPES:
        raise ConfigError(f"tenant type must be one of {', '.join(TENANT_TYPES)}, "
                          f"not {tenant_type!r}")
    for attempt in range(1, tries + 1):
        try:
            return _migrate_once(conn, tenant_type, lock_timeout)
        except psycopg.errors.LockNotAvailable as e:
            with conn.transaction():  # ended at once: the next try starts outside one
                holders = [r[0] for r in conn.execute(q("migrate_blockers")).fetchall()]
            who = "; ".join(holders) or "a transaction that has ended since"
            if attempt == tries:
                raise MigrationBlocked(
                    f"migrate could not lock jobqueue's tables within {lock_timeout:g} s, "
                    f"{tries} times (held by: {who}); nothing was changed: run it again when "
                    "the long jobs are done, or stop the workers first (README: upgrading)"
                    ) from e
            log.warning("migrate: a lock is held (by %s): nothing changed, trying again "
                        "(%d of %d)", who, attempt, tries)
            sleep(random.uniform(0.5, 1.0) * lock_timeout)
    return []  # tries < 1


def _migrate_once(conn: psycopg.Connection, tenant_type: str | None,
                  lock_timeout: float) -> list[str]:
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ConfigError("migrate needs a connection outside a transaction: a migration that "
                          "builds an index concurrently cannot run inside one")
    applied: list[str] = []
    autocommit = conn.autocommit
    conn.autocommit = True
    try:
        # Held for the whole run (the transactions below take it again: same session): another
        # migrate waits for this one, online steps included. It blocks no enqueue.
        conn.execute(q("migrate_session_lock"))
        try:
            while (online := _apply_in_transaction(conn, tenant_type, lock_timeout,
                                                   applied)) is not None:
                version, name, statements = online
                _drop_invalid_indexes(conn)
                for statement in statements:
                    conn.execute(statement)  # type: ignore[arg-type,unused-ignore]  # our own file
                with conn.transaction():
                    conn.execute(q("migration_record"), {"version": version, "name": name})
                    conn.execute(q("migrate_notify"))
                applied.append(name)
        finally:
            if not conn.closed and \
                    conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                conn.execute(q("migrate_session_unlock"))
    finally:
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.autocommit = autocommit
    return applied


def _apply_in_transaction(conn: psycopg.Connection, tenant_type: str | None,
                          lock_timeout: float, applied: list[str]
                          ) -> tuple[int, str, list[str]] | None:
    """Apply, in one transaction, the migrations due before the next online one; return that
    one (version, name, its statements), or None when none is left."""
    online: tuple[int, str, list[str]] | None = None
    with conn.transaction():
        conn.execute(q("migrate_lock"))  # another migrate: waited for (it blocks no enqueue)
        # From here every lock is waited for at most lock_timeout: an enqueue queued behind
        # this transaction's lock request never waits longer than that.
        conn.execute(q("migrate_lock_timeout"), {"ms": f"{int(lock_timeout * 1000)}ms"})
        conn.execute(q("migrations_bootstrap"))
        row = conn.execute(q("tenant_type_of")).fetchone()
        if row is None:
            conn.execute(sql.SQL("create domain jobqueue.tenant_id as {}").format(
                sql.SQL(tenant_type or "bigint")))  # one of TENANT_TYPES, checked above
        elif tenant_type is not None and row[0] != tenant_type:
            raise ConfigError(f"jobqueue is installed with {row[0]} tenant ids, not "
                              f"{tenant_type}: changing it is a migration of your own")
        done = {r[0] for r in conn.execute(q("migrations_applied")).fetchall()}
        here = []
        for version, name, path in available():
            if version in done:
                continue
            text = path.read_text()
            if (statements := online_statements(text)) is not None:
                online = (version, name, statements)
                break
            conn.execute(text)  # type: ignore[arg-type,unused-ignore]  # our own file
            conn.execute(q("migration_record"), {"version": version, "name": name})
            here.append(name)
        if here:
            # Workers that run now learn of it at once (and one older than the schema stops).
            conn.execute(q("migrate_notify"))
    applied.extend(here)
    return online


def online_statements(text: str) -> list[str] | None:
    """Return an online migration's statements, each run on its own outside a transaction (None:
    not an online migration).

    An online migration (its file has the line ``-- jobqueue: online``) builds its indexes with
    ``create index concurrently``: enqueues, claims and finishes go on during the build (a plain
    ``create index`` holds a lock that stops every write to the table for as long as the build
    takes). Each statement must be safe to run again (``if not exists``, ``if exists``): a
    migrate stopped half way runs the whole file again; an index a stopped build left invalid is
    dropped first (``_drop_invalid_indexes``). Statements are split at ``;`` (our own files).
    """
    lines = text.splitlines()
    if ONLINE not in (line.strip() for line in lines):
        return None
    body = "\n".join(line for line in lines if not line.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def _drop_invalid_indexes(conn: psycopg.Connection) -> None:
    """Before an online migration: drop the indexes of jobqueue that a stopped build (a cancel,
    a lost connection) left invalid; ``create index concurrently if not exists`` would keep
    them. Only migrate builds indexes there, under its lock: none is being built now."""
    for (name,) in conn.execute(q("invalid_indexes")).fetchall():
        log.warning("migrate: index %s was left invalid by a build that stopped: building it "
                    "again", name)
        conn.execute(sql.SQL("drop index concurrently if exists jobqueue.{}").format(
            sql.Identifier(name)))


def check(conn: psycopg.Connection, uses: tuple[str, ...] = ()) -> None:
    """Refuse to work on a schema that is missing, behind or ahead, or without a worker's grants.

    `uses`: the optional parts the worker runs, whose grants it needs too ('periodic',
    'round-robin').
    """
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
    if version[0] > latest():
        raise ConfigError(newer(db, version[0]))
    check_grants(conn, uses)


def check_grants(conn: psycopg.Connection, uses: tuple[str, ...] = (), *,
                 parts_only: bool = False) -> None:
    """Refuse a role that lacks a grant a worker's statements need (ConfigError).

    `uses`: the optional parts it runs ('periodic', 'round-robin'); `parts_only`: check only
    theirs (every worker's own were checked at its start).
    """
    missing = [r[0] for r in conn.execute(q("missing_grants"), {
        "uses": list(uses), "parts_only": parts_only}).fetchall()]
    if missing:
        raise ConfigError(f"role {conn.info.user!r} lacks {', '.join(missing)} in database "
                          f"{conn.info.dbname!r}: grant them (see the README's grants)")


def newer(db: str, version: int) -> str:
    """Say that the schema is ahead of this package, and what to do."""
    return (f"database {db!r} has the jobqueue schema at migration {version}, newer than this "
            f"worker knows ({latest()}): run the version that migrated it (deploy the new "
            "workers); an old worker would ignore what the new migrations mean (queues, "
            "priorities)")


def version_now(conn: psycopg.Connection) -> int | None:
    """Return the schema's migration version (None: none applied)."""
    row = conn.execute(q("schema_version")).fetchone()
    return None if row is None or row[0] is None else int(row[0])
