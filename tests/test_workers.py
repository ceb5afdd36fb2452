"""Finding workers: 1, 2, 4, 8 real worker processes on one queue, SKIP LOCKED vs FOR UPDATE."""

from __future__ import annotations

import pytest

from tenantlab import reproduce
from tenantlab.experiments import workers


def test_workers_drain_one_queue_without_lock_waits_or_duplicates(admin_dsn: str) -> None:
    res = workers.run(workers.Knobs(jobs=200, counts=(1, 3), plain=True))
    t = res.table
    assert t is not None and list(zip(t["claim"], t["workers"], strict=True)) == [
        ("skip", 1), ("skip", 3), ("plain", 1), ("plain", 3)]
    # Every round ran every job exactly once (job_runs), whichever claim.
    assert (t["done"] == 200).all() and (t["runs"] == 200).all() and (t["duplicates"] == 0).all()
    m = res.measured
    assert set(m["jobs_per_s"]) == {"1", "3"} and m["duplicates"] == 0
    assert all(v > 0 for v in m["jobs_per_s"].values())
    # SKIP LOCKED never queues behind another worker's row lock.
    assert max(m["lock_wait_share"].values()) < 0.02
    assert res.verdict.checks[0].ok and res.verdict.checks[1].ok


def test_bend_is_the_count_after_which_doubling_adds_little() -> None:
    assert workers.bend({"1": 100, "2": 190, "4": 200, "8": 150}) == 2
    assert workers.bend({"1": 100, "2": 200, "4": 400}) is None


def test_knobs_refuse_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        workers.run(workers.Knobs(jobs=10, counts=(0, 2)))


def test_reproduce_workers_keys(admin_dsn: str) -> None:
    out = reproduce.run(["workers"], echo=False)["findings"]["workers"]
    m = out["measured"]
    assert set(m["jobs_per_s"]) == {"1", "2", "4", "8"}
    assert all(isinstance(v, float) for v in m["jobs_per_s"].values())
    assert m["duplicates"] == 0 and isinstance(m["duplicates"], int)
    assert set(m["plain_for_update"]["lock_wait_share"]) == {"1", "2", "4", "8"}
    assert set(out["verdict"]["checks"]) >= {"every job ran, none twice",
                                            "SKIP LOCKED: no row-lock waits"}
