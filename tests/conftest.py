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
# Marks what this pytest process starts (kernels, workers, PgBouncers: children inherit it), so
# that a test can tell its own processes from another pytest-xdist worker's.
os.environ["TENANTLAB_TEST_PROCESS"] = str(os.getpid())


def _xdist_worker(config: pytest.Config) -> bool:
    """True in a pytest-xdist worker process (`make test` runs the suite in two)."""
    return hasattr(config, "workerinput")


def _xdist_controller(config: pytest.Config) -> bool:
    """True in the process that hands tests to pytest-xdist's workers (and runs none)."""
    return not _xdist_worker(config) and getattr(config.option, "dist", "no") != "no"


_shared: dict[str, object] = {}

#: Files whose tests must not run beside each other's on two pytest-xdist workers: they look at
#: the whole server for what a run leaves (`tenantlab_check_*` databases and sessions), and the
#: browser test runs notebook 13, which makes them. One worker runs a group's files in turn.
GROUPS = {"test_check.py": "check", "test_check_peers.py": "check", "test_browser.py": "check"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`, keep each file on one worker (its module fixtures set up once,
    its tests in order), and each group of GROUPS together."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            name = item.path.name
            item.add_marker(pytest.mark.xdist_group(GROUPS.get(name, name)))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist, start the one server every worker shares before the workers start:
    no two workers race to start it, and none stops it under the others (xdist starts its
    workers in a hook of its own that runs after this one)."""
    if _xdist_controller(session.config):
        server = db.server_session()
        dsn = server.__enter__()
        _shared.update(server=server, dsn=dsn)
        db.ensure_template(dsn)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, once every worker has ended: nothing the suite started may still be
    connected outside the scratch databases (each worker judged its own), then stop the server
    if this run started it."""
    server = _shared.pop("server", None)
    if server is None:
        return
    try:
        left = [b for b in db.leftover_backends(str(_shared["dsn"]))
                if not (b["datname"] or "").startswith("tenantlab_")]
        if left:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            session.config.get_terminal_writer().line(
                f"tenantlab backends left behind after the suite: {left}", red=True)
    finally:
        server.__exit__(None, None, None)  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def admin_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """Start the server unless it runs (and stop it after, if we started it)."""
    with db.server_session() as dsn:
        db.ensure_template(dsn)
        yield dsn
        # Nothing the suite started may still be connected: every experiment cleans up. Other
        # processes' scratch databases (another run on the same server) are not ours to judge;
        # under pytest-xdist, neither are the sessions outside them (another worker's tests
        # use them now): the controller looks at those once every worker has ended.
        mine = f"_{os.getpid()}_"
        shared = _xdist_worker(request.config)
        left = [b for b in db.leftover_backends(dsn)
                if mine in (b["datname"] or "")
                or not (shared or (b["datname"] or "").startswith("tenantlab_"))]
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
