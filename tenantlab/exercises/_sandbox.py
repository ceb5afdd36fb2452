"""Give an untrusted answer a database and a role of its own, and take both away afterwards.

An exercise's answer is someone else's SQL: it runs on a connection that *logs in* as a role
made for this one check (``tenantlab_ex_<hex>_w``), holding the worker role's grants in a
scratch database cloned for the check, and nothing else: no membership in any role (so
``set role``, ``reset role``, ``set session authorization``, ``commit`` or ``rollback`` cannot
raise its rights), no CREATE on the database or a schema, no TEMP, a VALID UNTIL a few minutes
ahead and a connection limit. Exercise 08 adds a second such role that owns the jobs table of
the scratch database (the only right a policy migration needs). Since the roles are new, an
answer can signal only the check's own sessions; the worker role's sessions elsewhere (a
running ``tenantlab worker``, another participant's check) are out of its reach.

The judge reads the outcome on a separate admin connection. The admin never runs what an
answer left behind with its own rights: it reads the jobs table with ``row_security = off``
(an answer's policy expression is never evaluated as the admin) and the catalogs.

Safety comes from these rights. Nothing here reads the answer's words.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from .. import db
from ..queries import q

log = logging.getLogger("tenantlab")

#: The prefix of every check role; the stale-role sweep and uninstall look for it.
ROLE_PREFIX = "tenantlab_ex_"
#: A check role expires on its own after this long, should the kit die before dropping it.
VALID_FOR = "10 minutes"
#: Enough for the exercises' own connections (three workers and a spare), no more.
CONNECTION_LIMIT = 6
#: Role settings the server enforces and an ordinary role cannot lift (superuser-only).
LIMITS = {"temp_file_limit": "64MB"}
#: Off only in tests that show what an answer would do on the admin connection.
ISOLATE = True


@dataclass(frozen=True)
class Sandbox:
    """One check's scratch database: the admin DSN (the judge), and the answer's DSNs."""

    name: str
    admin: str
    worker: str
    owner: str | None
    worker_role: str
    owner_role: str | None

    def connect(self, role: str = "worker", name: str | None = None,
                **kw: object) -> psycopg.Connection:
        """Connect as 'worker' (the check's worker role), 'owner' (08) or 'admin' (the judge)."""
        dsn = {"worker": self.worker, "owner": self.owner, "admin": self.admin}.get(role)
        if dsn is None:
            raise ValueError(f"no {role!r} login in this sandbox")
        if not ISOLATE and role != "admin":
            dsn = self.admin  # tests only: the answer on the admin connection
        return db.connect(dsn, name or role, **kw)  # type: ignore[arg-type]

    def roles(self) -> tuple[str, ...]:
        return tuple(r for r in (self.worker_role, self.owner_role) if r)


@contextmanager
def sandbox(label: str, owner: bool = False) -> Iterator[Sandbox]:
    """Make the check's roles and scratch database; drop both afterwards, also on interrupt."""
    dsn = db.admin_dsn()
    db.ensure_template(dsn)
    token = secrets.token_hex(5)
    worker_role = f"{ROLE_PREFIX}{token}_w"
    owner_role = f"{ROLE_PREFIX}{token}_o" if owner else None
    passwords = {r: secrets.token_urlsafe(18) for r in (worker_role, owner_role) if r}
    made: list[str] = []
    try:
        with db.connect(dsn, "exercise sandbox", autocommit=True) as admin:
            _sweep(admin)
            facts = admin.execute(q("sandbox_admin"), {"valid_for": VALID_FOR}).fetchone()
            assert facts is not None  # the admin's own row
            for role, password in passwords.items():
                _create_role(admin, role, password, *facts)
                made.append(role)
        with db.scratch(label, dsn) as s:
            with db.connect(s.admin, "exercise sandbox", autocommit=True) as admin:
                _grant(admin, s.name, worker_role, owner_role)
            try:
                yield Sandbox(
                    name=s.name, admin=s.admin,
                    worker=_login(dsn, s.name, worker_role, passwords[worker_role]),
                    owner=(_login(dsn, s.name, owner_role, passwords[owner_role])
                           if owner_role else None),
                    worker_role=worker_role, owner_role=owner_role)
            finally:
                with db.connect(s.admin, "exercise sandbox", autocommit=True) as admin:
                    _end_prepared(admin)
    finally:
        # After the scratch database is gone: nothing of the roles is left to depend on them.
        if made:
            _drop_roles(dsn, made)


def _login(dsn: str, dbname: str, role: str, password: str) -> str:
    return make_conninfo(dsn, dbname=dbname, user=role, password=password)


def _create_role(admin: psycopg.Connection, role: str, password: str, super_: bool,
                 v16: bool, valid_until: str) -> None:
    admin.execute(sql.SQL(
        "create role {} login password {} nosuperuser nocreatedb nocreaterole noinherit "
        "noreplication nobypassrls connection limit {} valid until {}").format(
            sql.Identifier(role), sql.Literal(password), sql.Literal(CONNECTION_LIMIT),
            sql.Literal(valid_until)))
    if not super_:
        # A managed admin (CREATEROLE, no superuser) acts through membership: to give the role
        # a table (08) and to end its sessions when the scratch database is dropped.
        admin.execute(sql.SQL("grant {} to current_user" + (" with inherit true, set true"
                                                            if v16 else "")).format(
            sql.Identifier(role)))
    for setting, value in LIMITS.items():
        try:
            with admin.transaction():
                admin.execute(sql.SQL("alter role {} set {} = {}").format(
                    sql.Identifier(role), sql.Identifier(setting), sql.Literal(value)))
        except psycopg.errors.InsufficientPrivilege:
            pass  # a managed admin may not set a superuser-only limit; the timeouts remain


def _grant(admin: psycopg.Connection, dbname: str, worker: str, owner: str | None) -> None:
    """Give the check's roles what the exercise needs in its scratch database, and no more."""
    for role in (worker, owner):
        if role is None:
            continue
        grants = [r[0] for r in admin.execute(q("sandbox_grants"),
                                              {"role": role, "from": db.WORKER}).fetchall()]
        for grant in grants:
            admin.execute(grant)  # composed by format(%I) in SQL
    # Nobody but the kit makes temporary tables or objects in this database.
    admin.execute(sql.SQL("revoke temporary on database {} from public").format(
        sql.Identifier(dbname)))
    if owner:
        # 08's migration changes the jobs table's policies: only its owner may. The owner of
        # the check, of this table, in this database: nothing else.
        # A new owner needs CREATE on the table's schema at the moment it takes it (unless a
        # superuser acts): given for that statement only, so it can create nothing there.
        who = sql.Identifier(owner)
        admin.execute(sql.SQL("grant create on schema jobqueue to {}").format(who))
        admin.execute(sql.SQL("alter table jobs owner to {}").format(who))
        admin.execute(sql.SQL("revoke create on schema jobqueue from {}").format(who))


def adopt_worker_policies(admin: psycopg.Connection, sb: Sandbox) -> int:
    """Make the answer's policies that name tenantlab_worker name the check's worker; count them.

    In the check the worker logs in as a role of its own, which stands in for tenantlab_worker;
    a policy written ``to tenantlab_worker`` must apply to it as it would to the real one.
    """
    alters = [r[0] for r in admin.execute(q("sandbox_policy_roles"),
                                          {"role": sb.worker_role, "from": db.WORKER})]
    for alter in alters:
        admin.execute(alter)  # composed by format(%I) in SQL
    return len(alters)


def _end_prepared(admin: psycopg.Connection) -> None:
    """Roll back what a check prepared (PREPARE TRANSACTION): it would outlive its sessions."""
    for gid, _owner in admin.execute(q("sandbox_prepared")).fetchall():
        with suppress(psycopg.Error):
            admin.execute(sql.SQL("rollback prepared {}").format(sql.Literal(gid)))


def _drop_roles(dsn: str, roles: list[str]) -> None:
    with db.connect(dsn, "exercise sandbox", autocommit=True) as admin:
        for role in roles:
            try:
                admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))
            except psycopg.Error as e:  # still has a session or an object: the sweep retries
                log.warning("could not drop the exercise role %s yet: %s", role, e)


def _sweep(admin: psycopg.Connection) -> None:
    """Drop check roles that a killed check left behind (expired, no session)."""
    for (role,) in admin.execute(q("sandbox_stale_roles")).fetchall():
        with suppress(psycopg.Error):
            admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))
