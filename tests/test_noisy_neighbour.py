"""Finding noisy-neighbour: one tenant's burst, 99 small tenants, FIFO vs the fair claims."""

from __future__ import annotations

import pytest

from notebooks import run_clean
from tenantlab import reproduce
from tenantlab.experiments import noisy_neighbour as noisy


def test_fair_claims_serve_the_small_tenants_before_the_burst_drains(admin_dsn: str) -> None:
    res = noisy.run(noisy.Knobs(burst=400, small_jobs=1, workers=3, limit=1))
    m = res.measured
    assert set(m) == {"fifo", "round-robin", "limit"}
    for policy, s in m.items():
        # No job starves and none runs twice, whatever the policy.
        assert (s["jobs"], s["done"], s["never_started"], s["duplicates"]) == (499, 499, 0, 0), \
            policy
    # FIFO: the small tenants (queued after the burst) start only once the burst has started.
    assert m["fifo"]["small_tenants_done_s"] > m["fifo"]["noisy_backlog_done_s"]
    # Fair: every small tenant's job started before the noisy backlog drained.
    for policy in ("round-robin", "limit"):
        assert m[policy]["small_tenants_done_s"] < m[policy]["noisy_backlog_done_s"], policy
    waits = res.data["waits"]
    assert set(waits["policy"]) == {"fifo", "round-robin", "limit"} and len(waits) == 3 * 499
    assert not res.data["samples"].empty


def test_a_chosen_policy_runs_with_fifo_as_its_baseline() -> None:
    assert noisy.Knobs(policy="limit").policies() == ("fifo", "limit")
    assert noisy.Knobs(policy="fifo").policies() == ("fifo",)
    assert noisy.Knobs(limit=3).fair("limit") == "limit=3"
    with pytest.raises(ValueError, match="unknown policy"):
        noisy.run(noisy.Knobs(policy="weighted"))


def test_reproduce_noisy_neighbour_keys(admin_dsn: str) -> None:
    out = reproduce.run(["noisy-neighbour"], echo=False)["findings"]["noisy-neighbour"]
    m = out["measured"]
    for policy in ("fifo", "round-robin", "limit"):
        assert set(m[policy]) >= {"small_tenants_wait_p95_s", "noisy_tenant_wait_p95_s",
                                  "jobs_per_s"}
        assert m[policy]["duplicates"] == 0 and m[policy]["done"] == m[policy]["jobs"]


@pytest.mark.notebook
def test_notebook_11_runs_top_to_bottom(admin_dsn: str) -> None:
    _, text = run_clean("11-the-noisy-neighbour.ipynb", admin_dsn)
    assert "as the expectation says" in text
