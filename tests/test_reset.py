"""Finding reset: DISCARD ALL breaks prepared statements; an open-transaction reset churns."""

from __future__ import annotations

import pytest

from notebooks import run_clean
from tenantlab import db, tenant
from tenantlab.experiments import reset

VARIANTS = {v.name: v for v in reset.VARIANTS}
PG3_0 = 'prepared statement "_pg3_0" does not exist'


def test_discard_all_fails_at_job_7_with_the_default_threshold(admin_dsn: str) -> None:
    trace = reset.trace_discard_all(jobs=15)
    assert trace["failed_jobs"][0] == 7 == reset.expected_failure_job(5)
    assert PG3_0 in trace["first_error"]
    # The failed job's rollback clears psycopg's cache; DISCARD ALL, prepared meanwhile, then
    # breaks the reset itself after job 13 and the pool replaces the connection.
    assert trace["failed_jobs"] == [7]
    assert trace["connections_opened"] == 2
    assert any('"_pg3_3" does not exist' in m for m in trace["reset_errors"])


@pytest.mark.parametrize("threshold", [1, 2])
def test_first_failure_follows_prepare_threshold(admin_dsn: str, threshold: int) -> None:
    trace = reset.trace_discard_all(threshold, jobs=threshold + 3)
    assert trace["failed_jobs"] == [threshold + 2]
    assert PG3_0 in trace["first_error"]


def test_discard_all_works_without_prepared_statements(admin_dsn: str) -> None:
    trace = reset.trace_discard_all(None, jobs=20)
    assert trace["failed_jobs"] == [] and trace["reset_errors"] == []
    assert trace["connections_opened"] == 1


def test_threshold_zero_lets_psycopg_notice_discard_all(admin_dsn: str) -> None:
    # DISCARD ALL is prepared at its first execution, so psycopg sees it enter its cache and
    # clears its own state every time.
    assert reset.trace_discard_all(0, jobs=12)["failed_jobs"] == []


def test_open_transaction_reset_opens_a_connection_per_job(scratch: db.Scratch) -> None:
    rows, facts = reset.run_variant(scratch, VARIANTS["reset_open_tx"], 20)
    assert all(r["error"] is None for r in rows)
    assert facts["connections_opened"] == 21  # the first, then one after every job
    assert facts["backends_used"] == 20
    assert sum("left in status INTRANS" in m for m in facts["warnings"]) == 20


@pytest.mark.parametrize("name", ["leaky", "local", "reset", "discard_all_unprepared"])
def test_other_variants_keep_one_connection(scratch: db.Scratch, name: str) -> None:
    rows, facts = reset.run_variant(scratch, VARIANTS[name], 20)
    assert all(r["error"] is None for r in rows)
    assert facts["connections_opened"] == 1 and facts["backends_used"] == 1
    assert facts["warnings"] == []


@pytest.mark.parametrize(("reset_fn", "left"), [(None, 100), (tenant.reset_idle, None)])
def test_reset_idle_clears_the_session_tenant(scratch: db.Scratch, reset_fn, left) -> None:
    pool = tenant.one_connection_pool(scratch.worker, "test reset", reset=reset_fn)
    with pool:
        with pool.connection() as conn:
            tenant.set_tenant(conn, 100, local=False)
        with pool.connection() as conn:
            assert tenant.current_tenant(conn) == left


def test_summary_carries_the_contract(admin_dsn: str) -> None:
    size = reset.Sizes(jobs=30, warmup=10, runs=1, churn_jobs=12, churn_warmup=2)
    df, m = reset.run(size=size)
    assert set(m["ms_per_job"]) == set(m["ratio_to_leaky"]) == set(reset.NAMES)
    assert m["ratio_to_leaky"]["leaky"] == 1.0
    assert m["discard_all_failed_at_job"] == 7
    assert m["discard_all_failures_per_run"] == [[7, 20]]
    assert m["connections_opened"]["reset_open_tx"] == 13
    assert m["jobs_run"] == {**{n: 30 for n in reset.NAMES}, "reset_open_tx": 12}
    checks = reset.judge(m)
    checks.pop("local_about_as_cheap_as_leaky")  # a timing claim: reproduce judges it
    assert all(checks.values()), checks


@pytest.mark.notebook
def test_notebook_02_runs_top_to_bottom(admin_dsn: str) -> None:
    _, text = run_clean("02-cleanup-cost.ipynb", admin_dsn)
    assert "measured DISCARD ALL failed at job 7" in text
