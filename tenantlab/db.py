"""Connections, the template database, and one scratch database per experiment run.

The admin connection comes from TENANTLAB_DATABASE_URL when set, else from the embedded server. A
template database holds the schema and the seeded invoices, built once per schema version;
every experiment run clones it (a file copy, far faster than seeding) and drops the clone
afterwards, so a re-run cell always starts from clean tables.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from jobqueue import migrations
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from . import queries, settings
from .errors import ConfigurationError, TenantlabError
from .server import ServerNotRunning, embedded, home

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("tenantlab")

APP = "tenantlab"  # application_name prefix of every connection the kit opens
TEMPLATE = "tenantlab_template"
OWNER = "tenantlab_owner"
WORKER = "tenantlab_worker"
#: The lab's databases find the production worker's tables (schema jobqueue) by their bare names.
SEARCH_PATH = sql.SQL('"$user", public, jobqueue')
_LOCK_TEMPLATE = 0x7E4A47  # advisory lock key: one template build at a time
_counter = itertools.count(1)


def admin_dsn() -> str:
    """Return the admin DSN: TENANTLAB_DATABASE_URL, or the running embedded server."""
    if url := settings.database_url():
        return url
    server = embedded()
    if server.pid() is None:
        raise ServerNotRunning(
            "PostgreSQL is not running: start it with `tenantlab up` (or `make lab`), "
            "or point TENANTLAB_DATABASE_URL at a PostgreSQL 15+ server"
        )
    if (asked := settings.port()) is not None and asked != server.port():
        # Not silently another server than the one the variable names.
        raise ConfigurationError(
            f"TENANTLAB_PORT={asked}, but the embedded server in {server.home} runs on port "
            f"{server.port()}: unset TENANTLAB_PORT, or move the server (`tenantlab down`, "
            f"then `tenantlab up --port {asked}`)")
    return server.dsn()


def with_db(dsn: str, dbname: str, **params: Any) -> str:
    """Return dsn pointing at another database (and other connection parameters)."""
    return make_conninfo(dsn, dbname=dbname, **params)


def worker_password(dsn: str) -> str:
    """Return the worker role's password: TENANTLAB_WORKER_PASSWORD, or derived from the admin's.

    Derived from the admin's user and password only, never from how the server is addressed:
    `localhost` and `127.0.0.1`, or the compose database seen from the host and from the lab
    container, give the same password. An admin URL without a password (peer or .pgpass
    login) mixes in a random secret kept with the kit's state instead. Every set-up
    (`ensure_template`) sets it again, so another admin's set-up cannot lock this one out.
    """
    if chosen := settings.worker_password():
        return chosen
    p = conninfo_to_dict(dsn)
    secret = str(p.get("password") or _local_secret())
    key = f"{p.get('user', '')}:{secret}"
    return hashlib.sha256(f"tenantlab-worker:{key}".encode()).hexdigest()[:24]


def _local_secret() -> str:
    path = home() / "worker-secret"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(18) + "\n")
        path.chmod(0o600)
        return path.read_text().strip()


def connect(dsn: str, name: str = "admin", **kwargs: Any) -> psycopg.Connection:
    """Open a connection tagged application_name='tenantlab <name>'."""
    return psycopg.connect(dsn, application_name=f"{APP} {name}", **kwargs)


def scalar(conn: psycopg.Connection, query: str, params: Any = None) -> Any:
    """Run a query that returns one value, and return it; no row at all is an error."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise LookupError(f"no row from: {query.strip().splitlines()[0][:80]}")
    return row[0]


def frame(conn: psycopg.Connection, query: str, params: Any = None) -> pd.DataFrame:
    """Run a query and return its rows as a DataFrame with the query's column names."""
    import pandas as pd  # here, not at the top: `tenantlab up` should not wait for pandas

    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query, params).fetchall()
        return pd.DataFrame(rows, columns=[c.name for c in cur.description or []])


def server_version(dsn: str | None = None) -> str:
    with connect(dsn or admin_dsn(), "version", autocommit=True) as conn:
        return str(scalar(conn, "show server_version"))


def ensure_template(dsn: str | None = None) -> str:
    """Set up the roles (once per process and server) and build the template unless current."""
    dsn = dsn or admin_dsn()
    version = queries.schema_version()
    with connect(dsn, "template", autocommit=True) as conn:
        conn.execute("select pg_advisory_lock(%s)", (_LOCK_TEMPLATE,))
        try:
            if dsn not in _roles_ready:
                # Under the lock: concurrent ALTER ROLEs fail with "tuple concurrently updated".
                ensure_roles(conn, dsn)
                _roles_ready.add(dsn)
            current = schema_of(conn, TEMPLATE)
            if current == version:
                return TEMPLATE
            _build_template(conn, dsn, version, exists=current is not None)
        finally:
            conn.execute("select pg_advisory_unlock(%s)", (_LOCK_TEMPLATE,))
    return TEMPLATE


_roles_ready: set[str] = set()


class MissingPrivilege(TenantlabError):
    """The admin role lacks what the kit needs to set itself up."""


def ensure_roles(admin: psycopg.Connection, dsn: str) -> None:
    """Create the owner and worker roles if needed, and set the worker's password (again)."""
    with admin.cursor(row_factory=dict_row) as cur:
        can = cur.execute(queries.q("admin_privileges")).fetchone() or {}
    if not can.get("superuser"):
        lacks = [p.upper() for p in ("createrole", "createdb") if not can.get(p)]
        if lacks:
            raise MissingPrivilege(
                f"the admin role {can.get('admin')!r} lacks {' and '.join(lacks)}: the kit needs a "
                "superuser, or a role with CREATEROLE and CREATEDB (a managed service's admin)")
        if not can.get("pg_monitor"):
            log.warning("the admin role %s is not a member of pg_monitor: the monitors may not "
                        "see other roles' sessions", can.get("admin"))
    admin.execute(queries.q("create_roles"))
    admin.execute(
        sql.SQL("alter role {} password {}").format(
            sql.Identifier(WORKER), sql.Literal(worker_password(dsn))
        )
    )


def _build_template(admin: psycopg.Connection, dsn: str, version: str, exists: bool) -> None:
    log.info("building template database %s (schema %s)", TEMPLATE, version)
    if exists:
        _drop(admin, TEMPLATE)
    building = f"{TEMPLATE}_building"
    _drop(admin, building)
    admin.execute(
        sql.SQL("create database {} owner {}").format(sql.Identifier(building), sql.Identifier(OWNER))
    )
    with connect(with_db(dsn, building), "template", autocommit=True) as conn:
        # The owner creates and seeds the tables (RLS is switched on after the seeding).
        conn.execute(sql.SQL("set role {}").format(sql.Identifier(OWNER)))
        # The production worker's tables first (schema jobqueue, the lab's int tenant ids;
        # outside a transaction: a migration may build an index concurrently), then the lab's
        # DDL, in one transaction, which names them without their schema.
        migrations.migrate(conn, tenant_type="integer")
        conn.autocommit = False
        conn.execute(sql.SQL("set search_path = {}").format(SEARCH_PATH))
        for _file, ddl in queries.schema():
            conn.execute(ddl)
        conn.execute("reset role")
        conn.commit()
    with connect(with_db(dsn, building), "template", autocommit=True) as conn:
        # As the owner: a managed admin may vacuum only the tables its role owns.
        conn.execute(sql.SQL("set role {}").format(sql.Identifier(OWNER)))
        conn.execute("vacuum (freeze, analyze)")
    admin.execute(sql.SQL("alter database {} rename to {}").format(
        sql.Identifier(building), sql.Identifier(TEMPLATE)))
    _set_search_path(admin, TEMPLATE)
    _stamp(admin, TEMPLATE, version)


def install_product(dsn: str) -> None:
    """Put the product's own schema in the database of `dsn` (an admin's), as an application does.

    A database cloned from the template holds the lab's jobqueue schema, its jobs table altered
    (sql/lab/jobs.sql): that goes, ``jobqueue migrate`` runs as the owner role, and the worker
    role gets the product README's grants. The lab's own tables (tenants, invoices) stay.
    """
    owner = make_conninfo(dsn, options=f"-c role={OWNER}")
    with connect(owner, "install product", autocommit=True) as conn:
        conn.execute(queries.q("product_drop_lab_schema"))
    done = subprocess.run([sys.executable, "-m", "jobqueue", "migrate", "--dsn", owner],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise TenantlabError(f"jobqueue migrate failed: {done.stderr.strip()}")
    with connect(owner, "install product", autocommit=True) as conn:
        conn.execute(queries.q("product_grants").encode())


def schema_of(admin: psycopg.Connection, name: str) -> str | None:
    """Return the schema version a database was made at ('' if unknown), None if it is missing."""
    row = admin.execute(queries.q("database_comment"), {"name": name}).fetchone()
    if row is None:
        return None
    prefix = "tenantlab schema "
    return row[0][len(prefix):] if row[0] and row[0].startswith(prefix) else ""


def _stamp(admin: psycopg.Connection, name: str, version: str) -> None:
    admin.execute(sql.SQL("comment on database {} is {}").format(
        sql.Identifier(name), sql.Literal(f"tenantlab schema {version}")))


def clone_template(admin: psycopg.Connection, name: str) -> None:
    """(Re)create database `name` as a copy of the template, owned by the owner role."""
    _drop(admin, name)
    admin.execute(sql.SQL("create database {} template {} owner {}").format(
        sql.Identifier(name), sql.Identifier(TEMPLATE), sql.Identifier(OWNER)))
    _set_search_path(admin, name)
    _stamp(admin, name, queries.schema_version())


def _set_search_path(admin: psycopg.Connection, name: str) -> None:
    # A database's settings are not copied from its template: every clone gets them again.
    admin.execute(sql.SQL("alter database {} set search_path = {}").format(
        sql.Identifier(name), SEARCH_PATH))


def _drop(admin: psycopg.Connection, name: str) -> None:
    # WITH (FORCE) ends the database's sessions first: an interrupted run cannot block the drop.
    admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


@dataclass(frozen=True)
class Scratch:
    """A database of its own for one experiment run, with DSNs for admin and worker."""

    name: str
    admin: str
    worker: str

    def connect(self, role: str = "worker", name: str | None = None, **kw: Any) -> psycopg.Connection:
        """Connect as 'worker' (the ordinary login role) or 'admin'."""
        if role not in ("worker", "admin"):
            raise ValueError(f"role must be 'worker' or 'admin', not {role!r}")
        return connect(self.worker if role == "worker" else self.admin, name or role, **kw)


@contextmanager
def scratch(label: str = "run", dsn: str | None = None) -> Iterator[Scratch]:
    """Clone the template into a fresh database; drop it (and end its sessions) afterwards."""
    dsn = dsn or admin_dsn()
    ensure_template(dsn)
    safe = "".join(c if c.isalnum() else "_" for c in label.lower())[:24]
    name = f"tenantlab_{safe}_{os.getpid()}_{next(_counter)}"
    with connect(dsn, "scratch", autocommit=True) as conn:
        clone_template(conn, name)
    worker = make_conninfo(dsn, dbname=name, user=WORKER, password=worker_password(dsn))
    try:
        yield Scratch(name=name, admin=with_db(dsn, name), worker=worker)
    finally:
        with connect(dsn, "scratch", autocommit=True) as conn:
            _drop(conn, name)


def scratch_databases(dsn: str | None = None) -> list[str]:
    """Return the names of scratch databases that exist now (runs in progress, or leftovers)."""
    with connect(dsn or admin_dsn(), "check", autocommit=True) as conn:
        return [r[0] for r in conn.execute(queries.q("scratch_databases"), ())]


def clean_scratch(dsn: str, dry_run: bool = False, every: bool = False) -> list[str]:
    """Drop the scratch databases a stopped process left (a killed kernel, `down --force` during
    a check), and the exercise check roles past their expiry; return what went.

    A scratch database is left over when nobody is connected to it and the process that made
    it (its name carries the pid) no longer runs on this machine; ``every``: any scratch
    database nobody is connected to (a server other machines' labs share: their pids mean
    nothing here, so say so on purpose).
    """
    from .server import alive

    removed: list[str] = []
    with connect(dsn, "clean-scratch", autocommit=True) as conn:
        for name, pid in conn.execute(queries.q("idle_scratch_databases")).fetchall():
            if not every and pid is not None and (pid == os.getpid() or alive(pid)):
                continue  # its process still runs: a run in progress, not a leftover
            if not dry_run:
                _drop(conn, name)
            removed.append(f"database {name}")
        for (role,) in conn.execute(queries.q("sandbox_stale_roles")).fetchall():
            if not dry_run:
                conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))
            removed.append(f"role {role}")
    return removed


def leftover_backends(dsn: str | None = None) -> list[dict]:
    """Return the kit's sessions still connected, other than the one asking."""
    with connect(dsn or admin_dsn(), "check", autocommit=True) as conn:
        with conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(queries.q("kit_sessions"), ()).fetchall()


@contextmanager
def server_session(port: int | None = None) -> Iterator[str]:
    """Yield the admin DSN; start the embedded server if needed and stop it only if we started it."""
    if url := settings.database_url():
        yield url
        return
    server = embedded()
    started = server.up(port=port)
    try:
        yield server.dsn()
    finally:
        if started:
            server.down()


def uninstall(dsn: str, dry_run: bool = False) -> list[str]:
    """Drop the kit's databases (template, scratch, playground) and its roles; return what went.

    Only what the kit made: databases stamped with its schema comment, and its two roles.
    """
    removed: list[str] = []
    with connect(dsn, "uninstall", autocommit=True) as conn:
        for (name,) in conn.execute(queries.q("kit_databases")).fetchall():
            if not dry_run:
                _drop(conn, name)
            removed.append(f"database {name}")
        for (role,) in conn.execute(queries.q("kit_roles")).fetchall():
            if not dry_run:
                conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))
            removed.append(f"role {role}")
    _roles_ready.discard(dsn)
    return removed
