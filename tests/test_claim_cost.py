"""The claim reads only claimable rows: jobs not yet due cost it nothing (issue 19, item 6).

Behaviour, not timing: the buffers the production claim touches (``EXPLAIN (ANALYZE, BUFFERS)``,
run in a transaction that is rolled back) are deterministic where milliseconds are not. The same
ready jobs are claimed with nothing in front of them, then behind 100,000 jobs scheduled for
tomorrow and 10,000 in backoff (and, separately, behind exhausted running jobs the reaper has
not reached yet); the claim must read about as much in both.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from jobqueue.queries import q

from tenantlab import db, queries

#: The ready jobs: as many as the bench claims. (A queue of a handful fits each index in one
#: page; any bigger table then costs one more page per index descent, whatever its rows are.)
READY = 500
SCHEDULED = 100_000
BACKOFF = 10_000
EXHAUSTED = 10_000
#: What one claim of one ready job may touch: the index descent, the row, its update and the
#: update's index entries (20 with nothing in front). The claim of 7e00ea7 read 1,690 behind
#: the scheduled jobs: it walked every one of them in id order.
BOUND = 50
RATIO = 1.5

# Inserted as admin, before the ready jobs (lower ids: in front of them in id order).
FILL = {
    "scheduled": """
        insert into jobs (tenant_id, kind, status, run_after)
        select 1 + g %% 100, 'noop', 'queued', clock_timestamp() + interval '1 day'
          from generate_series(1, %(n)s::int) as g""",
    "backoff": """
        insert into jobs (tenant_id, kind, status, attempts, run_after, last_error)
        select 1 + g %% 100, 'noop', 'queued', 1, clock_timestamp() + interval '5 minutes',
               'boom' from generate_series(1, %(n)s::int) as g""",
    "exhausted": """
        insert into jobs (tenant_id, kind, status, attempts, max_attempts, locked_until)
        select 1 + g %% 100, 'noop', 'running', 3, 3, clock_timestamp() - interval '1 minute'
          from generate_series(1, %(n)s::int) as g""",
}
READY_JOBS = """
    insert into jobs (tenant_id, kind) select 1 + g %% 3, 'noop' from generate_series(1, %(n)s::int) as g"""


def _claim() -> tuple[str, dict[str, Any]]:
    """Return the production worker's FIFO claim of one job, with its parameters."""
    sql = q("claim_leased")
    params: dict[str, Any] = {"lease": 30.0, "batch": 1}
    if "%(kinds)s" in sql:  # the kind filter: a worker claims only what it has handlers for
        params["kinds"] = ["noop"]
    if "%(queues)s" in sql:  # the queues a worker serves
        params["queues"] = ["default"]
    return sql, params


def _buffers(node: dict[str, Any]) -> int:
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


def _find(node: dict[str, Any], kind: str) -> dict[str, Any] | None:
    if node["Node Type"] == kind:
        return node
    for child in node.get("Plans", []):
        if (found := _find(child, kind)) is not None:
            return found
    return None


def claim_buffers(s: db.Scratch) -> dict[str, Any]:
    """Explain-analyze one claim as the worker, rolled back; return its buffers and plan."""
    sql, params = _claim()
    with s.connect("worker", "test claim cost") as conn:
        try:
            # Twice: the first run may set hint bits and prune pages; the second is steady state.
            for _ in range(2):
                (doc,) = conn.execute(b"explain (analyze, buffers, format json) " + sql.encode(),
                                      params).fetchone()
                conn.rollback()
        finally:
            conn.rollback()
    plan = (doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"]
    pick = _find(plan, "Limit") or plan  # the choice of job, without the update's writes
    return {"total": _buffers(plan), "choice": _buffers(pick), "rows": plan.get("Actual Rows"),
            "plan": plan}


def fill(s: db.Scratch, **counts: int) -> None:
    """Put `counts` rows of each kind in front, then the ready jobs; vacuum and analyze."""
    with s.connect("admin", "test claim cost fill", autocommit=True) as admin:
        admin.execute(queries.q("reset_queue"))
        for what, n in counts.items():
            admin.execute(FILL[what], {"n": n})
        admin.execute(READY_JOBS, {"n": READY})
        admin.execute(queries.q("horizon_vacuum_analyze_jobs"))


def _report(label: str, with_: dict[str, Any], without: dict[str, Any]) -> str:
    return (f"{label}: the claim read {with_['total']} buffers ({with_['choice']} choosing the job) "
            f"against {without['total']} ({without['choice']}) with nothing in front; plan:\n"
            + json.dumps(with_["plan"], indent=1)[:4000])


@pytest.mark.parametrize("front", [
    pytest.param({"scheduled": SCHEDULED, "backoff": BACKOFF}, id="scheduled_and_backoff"),
    pytest.param({"exhausted": EXHAUSTED}, id="exhausted_unreaped"),
])
def test_jobs_not_yet_due_cost_the_claim_nothing(scratch: db.Scratch, front: dict[str, int]) -> None:
    fill(scratch)
    without = claim_buffers(scratch)
    assert without["rows"] == 1, "the claim found no ready job"
    fill(scratch, **front)
    with_ = claim_buffers(scratch)
    assert with_["rows"] == 1, "the claim found no ready job behind the others"
    with scratch.connect("admin", "test claim cost check", autocommit=True) as admin:
        ready = admin.execute("select count(*) from jobs where status = 'queued' and attempts = 0"
                              " and (run_after is null or run_after <= now())").fetchone()
    assert ready == (READY,), "the explained claim was not rolled back"
    label = " and ".join(f"{n:,} {what}" for what, n in front.items())
    print(f"\n{label}: {with_['total']} buffers ({with_['choice']} choosing), "
          f"without: {without['total']} ({without['choice']})")
    assert with_["total"] < BOUND, _report(label, with_, without)
    assert with_["total"] <= RATIO * without["total"], _report(label, with_, without)



def test_the_first_claims_after_a_bulk_operation_read_tens_of_buffers(scratch: db.Scratch) -> None:
    """Issue 32, item 4: statistics from before enqueue_many or retry --dead leave the claim's
    plan alone (before 0004 it read the whole backlog: 101,053 buffers after 100,000 retried).

    The claim of a worker that was running before the bulk, on the plan PostgreSQL kept for its
    prepared claim: made while the table held 20 jobs, it read every queued job (637 buffers
    after 20,000 queued) until autoanalyze, where a fresh connection's claim read 21."""
    from tenantlab import bench

    got = bench.claim_after_bulk(scratch, jobs=20_000, samples=2)
    print(f"\n{got}")
    assert got["claim_after_bulk_buffers"] < BOUND, got
    assert got["claim_after_retry_dead_buffers"] < BOUND, got
