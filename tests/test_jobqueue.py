"""The lab's designs on the production worker: only through its public extension points.

jobqueue's own tests (handlers, batches, the heartbeat, prune, flags...) are in jobqueue/tests,
on a database its own migrate made; these need the lab's designs or its command line.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tenantlab import db, queue


@pytest.fixture
def conn(scratch: db.Scratch):
    with scratch.connect("worker", "test jobqueue", autocommit=True) as c:
        yield c


def status(conn: psycopg.Connection, job: int) -> tuple[str, int, str | None]:
    row = conn.execute("select status, attempts, last_error from jobs where id = %s",
                       (job,)).fetchone()
    assert row is not None
    return row


def test_a_batch_in_one_commit_finishes_with_the_designs_own_finish(conn) -> None:
    # The lab's naive lease-only queue (no fence) batched too: the taken-over job is finished
    # anyway, as that design does one job at a time.
    taken, other = queue.enqueue(conn, "count", tenant=2, count=2)
    naive = queue.Leased(lease=30, fence=False)
    claims = naive.claim_many(conn, 2)
    conn.execute("update jobs set attempts = 2 where id = %s", (taken,))
    outcomes = naive.run_together(conn, claims)
    assert [(o.claim.id, o.status) for o in outcomes] == [(taken, "done"), (other, "done")]
    assert status(conn, taken)[:2] == ("done", 2)


def test_the_lab_worker_overrides_no_private_method() -> None:
    private = [name for name, value in vars(queue.Leased).items()
               if name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
               and (inspect.isfunction(value)
                    or isinstance(value, (staticmethod, classmethod, property)))]
    assert private == [], f"tenantlab.queue.Leased overrides private methods: {private}"


def test_both_command_lines_refuse_fair_with_lossy_claim(scratch: db.Scratch,
                                                        env_with_db: dict[str, str],
                                                        tmp_path: Path) -> None:
    flags = ["--fair", "round-robin", "--lossy-claim", "--until-empty", "--dsn", scratch.worker]
    jq = subprocess.run([sys.executable, "-m", "jobqueue", *flags],
                        capture_output=True, text=True, timeout=60)
    lab = subprocess.run([sys.executable, "-m", "tenantlab", "worker", *flags,
                          "--events", str(tmp_path / "events.jsonl")],
                         env=env_with_db, capture_output=True, text=True, timeout=60)
    assert jq.returncode == 2, jq.stderr
    assert lab.returncode == 2, f"tenantlab worker accepted it (exit {lab.returncode}): " \
                                f"{lab.stderr.strip()}"
    # One validation for both: the same message after each command's own prefix.
    def message(err: str) -> str:
        return err.strip().splitlines()[-1].split(": ", 1)[-1]
    assert message(lab.stderr) == message(jq.stderr)
