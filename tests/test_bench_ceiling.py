"""The bench's ceiling: pgbench runs the worker's own claim and finish statements (issue 32).

Behaviour, not timing: the script is the worker's SQL text (only its parameters renamed for
pgbench), and a run finishes every job it claimed, each through the fenced finish (one job_runs
row per job, written by that finish).
"""

from __future__ import annotations

import pytest
from jobqueue.queries import q as jq

from tenantlab import bench, bench_ceiling, db


def test_the_script_is_the_workers_own_statements() -> None:
    one, batch = bench_ceiling.script(1), bench_ceiling.script(bench.BATCH)
    for name in ("start_if_owner", "complete_if_owner_and_claim"):
        assert bench_ceiling.statement(name, tenant=":tenant_id", batch="1") in one
    assert one.startswith("begin;") and one.rstrip().endswith("commit;")
    # the batch's lock of every fence, and its one set-based fenced finish (the no-op job's
    # handler sends nothing: no savepoint, no tenant per job)
    assert "savepoint" not in batch
    assert batch.count(bench_ceiling.statement("lock_batch_if_owner")) == 1
    assert batch.count(bench_ceiling.statement("complete_batch_if_owner").split(":ids")[0]) == 1
    # Only the parameters differ from the worker's text.
    body = jq("complete_if_owner_and_claim")
    assert bench_ceiling.statement("complete_if_owner_and_claim").replace(":", "") == \
        body.replace("%(", "").replace(")s", "").replace(":", "").rstrip(";")


def test_the_ceiling_finishes_every_job_it_claims(scratch: db.Scratch) -> None:
    binary = bench_ceiling.pgbench()
    if binary is None:
        pytest.skip("no pgbench next to the server's binaries or on PATH")
    for batch in (1, bench.BATCH):
        assert bench_ceiling.run(scratch, 30, batch, binary) > 0
        with scratch.connect("worker", "test ceiling", autocommit=True) as conn:
            runs = conn.execute("select count(*), count(distinct job_id) from jobqueue.job_runs"
                                " where worker = 'bench-ceiling' and outcome = 'done'").fetchone()
        assert runs == (30, 30)
