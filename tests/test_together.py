"""Notebook 09: the corrected worker under every fault at once, against the naive one."""

from __future__ import annotations

import pytest

from notebooks import run_clean
from tenantlab.experiments import together

MIX = together.Mix(count_jobs=24, poison=1, crashes=1, overruns=1, workers=3, time_limit=12)


@pytest.mark.slow
def test_corrected_loses_nothing_runs_nothing_twice_leaks_nothing(admin_dsn: str) -> None:
    s = together.run("corrected", mix=MIX).summary
    assert s["lost"] == 0
    assert s["executed_twice"] == 0
    assert s["wrong_tenant_rows"] == 0
    # The poison and crash jobs end dead, in the open; everything else is done.
    assert s["dead"] == MIX.poison + MIX.crashes
    assert s["done"] == s["jobs"] - s["dead"]
    assert s["worker_crashes"] == 3 * MIX.crashes  # one per attempt, max_attempts = 3
    assert s["holder_ended_by_timeout"] is True


@pytest.mark.slow
def test_naive_is_stuck_behind_poison_and_crashes(admin_dsn: str) -> None:
    s = together.run("naive", mix=MIX).summary
    assert s["lost"] > 0 and s["dead"] == 0
    assert s["poison_picks"] > 3  # picked again and again, never counted
    assert s["worker_crashes"] > 3  # every worker that reaches the crash job dies
    assert s["holder_ended_by_timeout"] is False


def test_mix_refuses_a_heartbeat_not_shorter_than_the_lease() -> None:
    with pytest.raises(ValueError, match="heartbeat must be shorter than the lease"):
        together.Mix(lease=1.0, heartbeat=1.0)


@pytest.mark.notebook
def test_notebook_09_runs_top_to_bottom(admin_dsn: str) -> None:
    _, out = run_clean("09-what-we-would-build.ipynb", admin_dsn)
    assert "✓ as the expectation says" in out and "✓ corrected: jobs lost: 0" in out
