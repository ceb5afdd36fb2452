"""The kit's views of jobqueue's operator commands: a notebook's table, the export, `tenantlab queue`.

jobqueue's own operator tests are jobqueue/tests/test_ops.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from jobqueue import enqueue, ops

from tenantlab import db

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def conn(scratch: db.Scratch):
    with scratch.connect("worker", "test jobqueue ops", autocommit=True) as c:
        yield c


def child_env() -> dict[str, str]:
    """This checkout first; no PG*/JOBQUEUE_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBQUEUE_", "PG"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_a_notebook_shows_the_same_stats_as_a_table(conn: psycopg.Connection) -> None:
    from tenantlab import queue_stats

    enqueue(conn, "nobody", tenant=1)
    enqueue(conn, "nobody", tenant=2)
    df = queue_stats.frame(conn)
    assert list(df.columns) == list(ops.STATUSES)
    assert df.loc["nobody", "queued"] == 2 and df.loc["all", "queued"] == 2
    page = queue_stats.html(conn)
    assert "<table" in page and "no running worker serves: nobody" in page


def test_the_export_carries_the_operators_commands(tmp_path: Path) -> None:
    from tenantlab.export import export

    package = export(tmp_path, "shop")
    for rel in ("ops.py", "logs.py", "migrations/0002_outcomes.sql"):
        assert (package / rel).is_file(), rel
    assert "jobqueue stats" in (package / "README.md").read_text()
    assert "tenantlab" not in (package / "ops.py").read_text()


def test_the_kits_cli_has_the_same_commands(scratch: db.Scratch, conn: psycopg.Connection) -> None:
    job = enqueue(conn, "nobody", tenant=9)
    r = subprocess.run([sys.executable, "-m", "tenantlab", "queue", "jobs", "--json", "--dsn",
                        scratch.worker], env=child_env(), cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [(j["id"], j["status"]) for j in json.loads(r.stdout)] == [(job, "queued")]
    r = subprocess.run([sys.executable, "-m", "tenantlab", "queue", "cancel", str(job + 1),
                        "--dsn", scratch.worker], env=child_env(), cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == f"tenantlab queue: no job {job + 1}"
