"""Finding rls-jobs: the tenant policy on jobs empties the queue silently; notebook 08."""

from __future__ import annotations

import pytest

from notebooks import run_clean
from tenantlab.experiments import rls_jobs

pytestmark = pytest.mark.slow


def test_policy_on_jobs_hides_every_job_without_an_error(admin_dsn: str) -> None:
    res = rls_jobs.run(rls_jobs.Knobs(jobs=100))
    s = res.measured
    assert res.verdict.valid and len(res.verdict.checks) == 3
    assert (s["visible_without_tenant"], s["total_jobs"], s["claimed"], s["error"]) \
        == (0, 100, 0, None)
    assert s["claimed_by_worker_process"] == 0
    assert s["visible_as_tenant_7"] == 1
    assert (s["visible_after_fix"], s["done_after_fix"], s["counted_right_after_fix"]) \
        == (100, 100, 100)
    # The cause removed: no policy on jobs (this run after the fix). What the worker saw and
    # claimed then, judged as the trap, fails the trap's checks: the queue is not empty.
    without = rls_jobs.judge({**s, "visible_without_tenant": s["visible_after_fix"],
                              "claimed": s["done_after_fix"]})
    assert [c.name for c in without.checks if not c.ok] == [
        "jobs visible without tenant context", "claim without tenant context"]


@pytest.mark.notebook
def test_notebook_08_runs_top_to_bottom(admin_dsn: str) -> None:
    _, text = run_clean("08-rls-on-the-jobs-table.ipynb", admin_dsn)
    assert "✓ as the article says" in text and "✗" not in text
