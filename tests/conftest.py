"""One embedded server per test session (or TENANTLAB_DATABASE_URL); a scratch database per test."""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from psycopg import sql

from tenantlab import db, server, settings

ROOT = Path(__file__).resolve().parent.parent
# Marks what this pytest process starts (kernels, workers, PgBouncers: children inherit it), so
# that a test can tell its own processes from another pytest-xdist worker's.
os.environ["TENANTLAB_TEST_PROCESS"] = str(os.getpid())
# `make test` runs two pytest-xdist workers. The first uses the checkout's embedded server as a
# single process does; any other gets an embedded server of its own (.tenantlab/gw1, started and
# stopped by it, initialised on its first run), so that no test sees another worker's sessions:
# the horizon's "other sessions' transactions", the checks of what a run left on the server.
# Set here, before anything reads the settings; children inherit it.
if (_worker := os.environ.get("PYTEST_XDIST_WORKER", "gw0")) != "gw0" \
        and not settings.database_url():
    os.environ["TENANTLAB_HOME"] = str(server.home() / _worker)
    os.environ.pop("TENANTLAB_PORT", None)


@contextmanager
def _one_start_at_a_time() -> Iterator[None]:
    """Hold a lock while this process starts its server: two pytest-xdist workers starting
    theirs at once would both pick the first free port."""
    digest = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"tenantlab-test-start-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def admin_dsn() -> Iterator[str]:
    """Start the server unless it runs (and stop it after, if we started it)."""
    with ExitStack() as stack:
        with _one_start_at_a_time():
            dsn = stack.enter_context(db.server_session())
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


#: The longest files, longest first (seconds of one serial run on 2 shared cores, Dec 2026:
#: 398, 227, 192, 157, 156, 106, 105, 85, 75, 60, 58, 50, 50 of 2,236): handed out first, the
#: short ones fill in after, so that the two workers end close together.
LONGEST_FIRST = ("test_browser.py", "test_overrun.py", "test_horizon.py", "test_noisy_neighbour.py",
                 "test_vacuum.py", "test_together.py", "test_vanish.py", "test_lint.py",
                 "test_check.py", "test_setup_managed.py", "test_reset.py", "test_pgbouncer.py",
                 "test_workers.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`: --dist loadfile, each file on one worker), hand out the
    longest files first: the order xdist's controller reads from the workers' collections
    (with --no-loadscope-reorder)."""
    if hasattr(config, "workerinput"):
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


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
