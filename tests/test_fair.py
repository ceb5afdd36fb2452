"""The production worker's fair claims (``--fair round-robin|limit=N``): who is served, and when."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from jobqueue import ConfigError, Leased, WorkerOptions, enqueue
from jobqueue.fair import Fair
from jobqueue.options import add_flags, from_args, to_argv

from tenantlab import db, queue
from tenantlab.experiments._workers import fleet
from tenantlab.queries import q

NOOP = {"noop": lambda conn, job: None}


@pytest.fixture
def conn(scratch: db.Scratch):
    with scratch.connect("worker", "test fair", autocommit=True) as c:
        yield c


def burst_then_small(conn: psycopg.Connection, burst: int, small: range) -> None:
    """Tenant 1 queues a burst; then each small tenant one job, after it (higher ids)."""
    for _ in range(burst):
        enqueue(conn, "noop", tenant=1)
    for t in small:
        enqueue(conn, "noop", tenant=t)


def test_fair_values_are_round_robin_or_limit_and_anything_else_says_what_is_valid() -> None:
    assert Fair.parse("round-robin") == Fair("round-robin")
    assert Fair.parse("limit=3") == Fair("limit", 3) and str(Fair("limit", 3)) == "limit=3"
    for bad in ("fifo", "limit", "limit=0", "limit=-1", "round_robin"):
        with pytest.raises(ConfigError, match="round-robin, limit=N"):
            Fair.parse(bad)
    parser = argparse.ArgumentParser()
    add_flags(parser)
    options = from_args(WorkerOptions, parser.parse_args(["--fair", "limit=2"]))
    assert options.fair == "limit=2" and to_argv(options) == ["--fair", "limit=2"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--fair", "weighted"])
    with pytest.raises(ConfigError, match="lossy-claim has no fair variant"):
        Leased(NOOP, fair="round-robin", lossy_claim=True)


def test_round_robin_serves_every_tenant_once_before_the_burst_goes_on(conn) -> None:
    burst_then_small(conn, 20, range(2, 6))
    leased = Leased(NOOP, fair="round-robin")
    served = []
    while (outcome := leased.run_one(conn)) is not None:
        assert outcome.status == "done"
        served.append(outcome.claim.tenant_id)
    # Tenants 2..5 queued after the whole burst, and each is served in the first round.
    assert sorted(served[:5]) == [1, 2, 3, 4, 5]
    assert served[5:] == [1] * 19
    runs = conn.execute(q("run_counts")).fetchone()
    assert runs == (24, 24, 0)  # every job ran, none twice


def test_a_chained_claim_takes_the_next_tenant_in_turn(conn) -> None:
    burst_then_small(conn, 5, range(2, 4))
    leased = Leased(NOOP, fair="round-robin")
    claim = leased.claim(conn)
    assert claim is not None and claim.tenant_id == 1
    done = leased.execute(conn, claim, claim_next=1)
    assert done.status == "done" and [c.tenant_id for c in done.claimed] == [2]
    nxt = leased.execute(conn, done.claimed[0], claim_next=1)
    assert [c.tenant_id for c in nxt.claimed] == [3]
    row = conn.execute("select status, attempts from jobs where id = %s",
                       (nxt.claimed[0].id,)).fetchone()
    assert row == ("running", 1)  # counted at the claim, with the finish's commit


def test_limit_skips_a_tenant_at_its_limit_until_a_lease_runs_out(conn) -> None:
    burst_then_small(conn, 5, range(2, 3))
    leased = Leased(NOOP, fair="limit=2", lease=30)
    tenants = [c.tenant_id for c in (leased.claim(conn), leased.claim(conn), leased.claim(conn))
               if c is not None]
    assert tenants == [1, 1, 2]  # the third claim skips tenant 1's three queued jobs
    assert leased.claim(conn) is None  # tenant 1 runs 2: its jobs wait, nobody else has any
    # A dead worker's job stops counting when its lease ends: tenant 1 is below its limit again.
    conn.execute("update jobs set locked_until = clock_timestamp() - interval '1 second' "
                  "where id = (select min(id) from jobs)")
    again = leased.claim(conn)
    assert again is not None and again.tenant_id == 1


@pytest.mark.parametrize("fair", ["round-robin", "limit=1"])
def test_fair_workers_start_a_small_tenant_early_starve_nobody_and_run_nothing_twice(
        scratch: db.Scratch, fair: str) -> None:
    with scratch.connect("worker", "test fair enqueue", autocommit=True) as conn:
        queue.enqueue(conn, "noop", tenant=1, count=400)
        for t in range(2, 21):
            queue.enqueue(conn, "noop", tenant=t)
        with tempfile.TemporaryDirectory() as tmp, fleet(scratch.worker) as f:
            procs = [f.start(events=Path(tmp) / "events.jsonl", name=f"w{i}", fair=fair,
                             until_empty=True, poll=0.05) for i in range(3)]
            deadline = time.monotonic() + 120
            while any(p.poll() is None for p in procs):
                assert time.monotonic() < deadline, "the workers did not drain the queue"
                time.sleep(0.1)
        states = dict(conn.execute(q("job_counts")).fetchall())
        runs = conn.execute(q("run_counts")).fetchone()
        starts = dict(conn.execute(
            "select j.tenant_id = 1, max(r.started) from jobs j join job_runs r on r.job_id = j.id "
            "group by 1").fetchall())
    assert states == {"done": 419}  # no job starves: the burst and every small tenant's
    assert runs == (419, 419, 0)  # and none ran twice
    # The small tenants queued after the whole burst, and were all served before it drained.
    assert starts[False] < starts[True]


def test_a_round_robin_claim_walks_a_few_tenants_not_every_tenant_with_work(
        admin_dsn: str) -> None:
    """Issue 32, item 3: the claim's cost does not grow with the tenants that have work; the
    full listing (one descent per tenant) is the rare one. Before, every claim listed them all."""

    from tenantlab import bench

    with bench.product_db() as p, p.connect("worker", "test fair walk", autocommit=True) as c:
        _walks_a_few(c)


def _walks_a_few(conn) -> None:
    from jobqueue import enqueue_many

    tenants = 2000  # the product's schema: tenants are the application's, no foreign key
    enqueue_many(conn, [{"kind": "noop", "tenant": t, "payload": {}} for t in range(1, tenants + 1)]
                 * 2)
    listed, _ = _claim_plan(conn, Leased(NOOP, fair="round-robin"), full=True)
    leased = Leased(NOOP, fair="round-robin")
    served = [leased.run_one(conn).claim.tenant_id for _ in range(5)]  # the first lists them all
    assert served == [1, 2, 3, 4, 5]
    walk, _ = _claim_plan(conn, leased, full=False)
    # The walk: the newest WINDOW jobs looked up (a job and its tenant's turn each: about 300
    # buffers whatever the tenants), one tenant probed, its turn moved. The listing: 5 a tenant.
    assert listed > 2 * tenants and walk < 600 and listed > 10 * walk, (listed, walk)


def _indexes(plan: dict) -> set[str]:
    """Return the indexes a plan (EXPLAIN's JSON) reads, at any depth."""
    own = {plan["Index Name"]} if "Index Name" in plan else set()
    return own.union(*(_indexes(p) for p in plan.get("Plans", [])))


def _claim_plan(conn, leased: Leased, full: bool) -> tuple[int, set[str]]:
    import json

    query, params = leased.claim_query(1)
    params["full"] = full
    with conn.transaction(force_rollback=True):
        (doc,) = conn.execute(b"explain (analyze, buffers, format json) " + query.encode(),
                              params).fetchone()
    plan = (doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"]
    return (int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0)),
            _indexes(plan))


def test_round_robin_reads_the_tenant_index_whatever_the_statistics_say(admin_dsn: str) -> None:
    """Issue 32, item 3: with statistics older than the queue (the table's last analyze saw only
    dead jobs, as the bench's claim cases leave it), the tenant lookups were planned on
    jobs_claimable, the tenant as a filter: the full listing read it once per tenant (8.1 s and
    2,460,000 buffers for one claim at 10,000 tenants, the next claims full listings too), each
    probe read about 100 buffers. Since 0005 they cannot use it (its predicate names the kind)."""
    from jobqueue import enqueue_many

    from tenantlab import bench

    tenants = 2000
    with bench.product_db() as p:
        with p.connect("admin", "test fair stale", autocommit=True) as admin:
            admin.execute(q("bench_fill_dead"), {"n": 20_000})
            admin.execute(q("horizon_vacuum_analyze_jobs"))
            admin.execute(q("reset_queue"))
            admin.execute(q("horizon_vacuum_analyze_jobs"))  # empty: the statistics stay
            admin.execute("alter table jobqueue.jobs set (autovacuum_enabled = false)")
        with p.connect("worker", "test fair stale", autocommit=True) as c:
            jobs = [{"kind": "noop", "tenant": t, "payload": {}} for t in range(1, tenants + 1)]
            # Bulks under BULK_ANALYZE each (as an application's smaller batches, or its own
            # SQL): none analyzes the table (0006), so the statistics stay older than the queue.
            for chunk in range(0, len(jobs), 250):
                enqueue_many(c, jobs[chunk:chunk + 250] * 2)
            assert c.execute("select reltuples from pg_class "
                             "where oid = 'jobqueue.jobs'::regclass").fetchone() == (0,)
            listed, listed_with = _claim_plan(c, Leased(NOOP, fair="round-robin"), full=True)
            leased = Leased(NOOP, fair="round-robin")
            assert [leased.run_one(c).claim.tenant_id for _ in range(3)] == [1, 2, 3]
            walk, walk_with = _claim_plan(c, leased, full=False)
    assert "jobs_claimable" not in listed_with | walk_with, (listed_with, walk_with)
    # The listing: one descent per tenant (about 5 buffers each), not a scan per tenant; the
    # walk: the newest jobs and their turns (about 100), one probe of a few buffers.
    assert listed < 10 * tenants and walk < 200, (listed, walk)


def test_an_idle_tenant_with_a_new_job_is_served_by_the_next_claim(conn) -> None:
    leased = Leased(NOOP, fair="round-robin")
    for t in (1, 2):
        enqueue(conn, "noop", tenant=t)
    assert [leased.run_one(conn).claim.tenant_id for _ in range(2)] == [1, 2]
    assert leased.run_one(conn) is None  # both walked past: idle, out of the walk
    enqueue(conn, "noop", tenant=1)
    outcome = leased.run_one(conn)  # not a full listing: found among the newest jobs
    assert outcome is not None and outcome.claim.tenant_id == 1


@pytest.mark.parametrize("fair", ["round-robin", "limit=1"])
def test_a_fair_claim_keeps_one_plan_instead_of_planning_every_claim(
        scratch: db.Scratch, conn, fair: str) -> None:
    """Issue 32, item 3: PostgreSQL keeps the generic plan of the prepared claim. limit=N was
    planned afresh every claim (a fresh plan saw one queue and a batch of 1 and looked five
    times cheaper than the generic one): 0.26 ms a claim instead of 0.07."""
    queue.enqueue(conn, "noop", tenant=1, count=1000)  # noisy-neighbour's burst, analyzed
    for t in range(2, 5):
        queue.enqueue(conn, "noop", tenant=t)
    with scratch.connect("admin", "test fair analyze", autocommit=True) as admin:
        admin.execute(q("analyze_jobs"))
    leased = Leased(NOOP, fair=fair)
    for _ in range(15):  # psycopg prepares a statement at its 5th execution
        assert leased.run_one(conn) is not None
    # The claim's own statement (limit=N: its busy tenants; round-robin: its tenant turns).
    mark = "%having count(*)%" if fair.startswith("limit") else "%tenant_turns%"
    rows = conn.execute("select generic_plans, custom_plans from pg_prepared_statements "
                        "where statement like %s", (mark,)).fetchall()
    assert len(rows) == 1 and rows[0][0] >= 5 and rows[0][1] <= 5, rows
