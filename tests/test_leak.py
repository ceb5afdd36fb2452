"""Finding leak: the session-form tenant leaks to the next borrower after success; local never."""

from __future__ import annotations

import pytest

from notebooks import run_clean
from tenantlab import db, tenant
from tenantlab.experiments import leak
from tenantlab.queries import q

TENANT_INVOICES = {1: 20000, 2: 10000, 3: 6666}


def test_article_variants_leak_exactly_as_the_article_says(admin_dsn: str) -> None:
    df, summary = leak.run()
    assert summary["seen_after_job"] == {
        "session": [20000, 10000, 6666],
        "session_job2_fails": [20000, 20000, 6666],
        "autocommit_job2_fails": [20000, 10000, 6666],
        "local": [0, 0, 0],
    }
    # Every job saw its own tenant's invoices, the failing one included (it failed after counting).
    jobs = df[df.actor == "job"]
    assert list(jobs.invoices_seen) == [TENANT_INVOICES[t] for t in jobs.tenant]
    # What leaked is a tenant context the borrower never set: the one its count matches.
    leaked = df[(df.actor == "borrower") & df.leaked]
    assert list(leaked.invoices_seen) == [TENANT_INVOICES[t] for t in leaked.context]


@pytest.mark.parametrize("autocommit", [False, True], ids=["transaction", "autocommit"])
def test_local_form_never_leaks_also_when_a_job_raises(admin_dsn: str, autocommit: bool) -> None:
    variants = tuple(leak.variants_for(fail, autocommit)[1] for fail in (None, 1, 2, 3))
    _, summary = leak.run(variants=variants)
    assert summary["seen_after_job"] == {v.name: [0, 0, 0] for v in variants}


def test_knobs_move_the_leak(admin_dsn: str) -> None:
    variants = (*leak.variants_for(1, False), *leak.variants_for(None, True))
    _, summary = leak.run(variants=variants, jobs=4)
    seen = summary["seen_after_job"]
    # Job 1 fails and rolls back: nothing committed yet, so nothing to leak after it.
    assert seen["session_job1_fails"] == [0, 10000, 6666, 5000]
    assert seen["local_job1_fails"] == [0, 0, 0, 0]
    assert seen["session_autocommit_ok"] == [20000, 10000, 6666, 5000]
    assert seen["local_autocommit_ok"] == [0, 0, 0, 0]


def test_bad_failing_job_is_refused(scratch: db.Scratch) -> None:
    with pytest.raises(ValueError, match="fail_job must be none or between 1 and 3"):
        leak.run_variant(scratch, leak.Variant("x", fail_job=4), jobs=3)


def test_local_form_in_autocommit_needs_a_transaction(scratch: db.Scratch) -> None:
    with scratch.connect(autocommit=True) as conn:
        with pytest.raises(tenant.TenantContextError, match="needs a transaction"):
            tenant.set_tenant(conn, 1, local=True)
        with conn.transaction():
            tenant.set_tenant(conn, 2, local=True)
            assert conn.execute(q("count_invoices")).fetchone()[0] == 10000
        assert tenant.current_tenant(conn) is None


def test_tenant_must_be_an_int_and_is_bound(scratch: db.Scratch) -> None:
    assert "%(tenant)s" in q("tenant_set_local") and "%(tenant)s" in q("tenant_set_session")
    with scratch.connect() as conn:
        for bad in ("1", 1.0, True):
            with pytest.raises(tenant.TenantContextError, match="tenant must be an int"):
                tenant.set_tenant(conn, bad)  # type: ignore[arg-type]


@pytest.mark.notebook
def test_notebook_01_runs_top_to_bottom(admin_dsn: str) -> None:
    _, text = run_clean("01-tenant-context-leak.ipynb", admin_dsn)
    assert "✓ as the article says" in text
    assert "refused: local tenant context needs a transaction" in text
