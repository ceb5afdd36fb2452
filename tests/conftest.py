"""One embedded server per test session (or TENANTLAB_DATABASE_URL); a scratch database per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

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
