"""One embedded server per test session (or TENANTLAB_DATABASE_URL); a scratch database per test."""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg import sql

from tenantlab import db

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def admin_dsn() -> Iterator[str]:
    """Start the server unless it runs (and stop it after, if we started it)."""
    with db.server_session() as dsn:
        db.ensure_template(dsn)
        yield dsn
        # Nothing the suite started may still be connected: every experiment cleans up. Other
        # processes' scratch databases (another run on the same server) are not ours to judge.
        mine = f"_{os.getpid()}_"
        left = [b for b in db.leftover_backends(dsn)
                if not (b["datname"] or "").startswith("tenantlab_") or mine in b["datname"]]
        assert not left, f"tenantlab backends left behind after the suite: {left}"
        dbs = [name for name in db.scratch_databases(dsn) if mine in name]
        assert not dbs, f"scratch databases left behind: {dbs}"


@pytest.fixture
def scratch(admin_dsn: str, request: pytest.FixtureRequest) -> Iterator[db.Scratch]:
    """A fresh database cloned from the template, dropped after the test."""
    with db.scratch(request.node.name[:24], admin_dsn) as s:
        yield s


@pytest.fixture
def env_with_db(admin_dsn: str) -> dict[str, str]:
    """Environment for child processes (workers, notebooks) that must find this server."""
    return dict(os.environ, TENANTLAB_DATABASE_URL=admin_dsn)


_fresh = itertools.count(1)


@pytest.fixture
def fresh_db(admin_dsn: str) -> Iterator[dict[str, str]]:
    """A fresh database (not the lab's template) owned by a throwaway owner role, and a
    throwaway worker role with no grants: what an application's own server looks like.

    Keys: ``admin`` (the admin's DSN on it), ``owner`` and ``worker_role`` (role names),
    ``worker`` (the worker role's DSN). Dropped afterwards, roles too.
    """
    pid, n = os.getpid(), next(_fresh)
    name, owner, worker = (f"tenantlab_fresh_{pid}_{n}", f"jq_owner_{pid}_{n}",
                           f"jq_worker_{pid}_{n}")
    password = secrets.token_hex(12)
    ident = sql.Identifier

    def drop(admin) -> None:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(ident(name)))
        for role in (worker, owner):
            admin.execute(sql.SQL("drop role if exists {}").format(ident(role)))

    with db.connect(admin_dsn, "test fresh db", autocommit=True) as admin:
        drop(admin)
        admin.execute(sql.SQL("create role {} nologin").format(ident(owner)))
        admin.execute(sql.SQL("create role {} login password {}").format(
            ident(worker), sql.Literal(password)))
        admin.execute(sql.SQL("create database {} owner {}").format(ident(name), ident(owner)))
    try:
        yield {"admin": db.with_db(admin_dsn, name), "owner": owner, "worker_role": worker,
               "worker": db.with_db(admin_dsn, name, user=worker, password=password)}
    finally:
        with db.connect(admin_dsn, "test fresh db", autocommit=True) as admin:
            drop(admin)
