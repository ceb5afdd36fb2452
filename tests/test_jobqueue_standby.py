"""The exported worker against a real hot standby (issue 31): an outage with one log line and a
limit, not reconnections several times a second for ever. The standby is made by
tools/jobqueue_standby.py (pg_basebackup -R from the embedded PostgreSQL 17), on the kit's own
server only; jobqueue's own suite covers the same with default_transaction_read_only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tenantlab import server, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import jobqueue_standby  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_worker_pointed_at_a_hot_standby_waits_with_a_limit(admin_dsn: str) -> None:
    # Asked here, not at collection: on a fresh clone the embedded server (started by the
    # admin_dsn fixture) has no data directory yet when the tests are collected.
    if settings.database_url() is not None or not (server.home() / "data").is_dir():
        pytest.skip("needs the embedded server (a standby of it is made here)")
    seen = jobqueue_standby.probe(admin_dsn)
    assert seen.status == 3, seen.log
    assert seen.reconnecting == 1 and "hot standby" in seen.log, seen.log
