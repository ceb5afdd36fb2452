"""Finding workers: 1, 2, 4, 8 real worker processes on one queue, SKIP LOCKED vs FOR UPDATE."""

from __future__ import annotations

import pytest

from tenantlab import reproduce
from tenantlab.experiments import workers


def test_workers_drain_one_queue_without_claim_waits_or_duplicates(admin_dsn: str) -> None:
    res = workers.run(workers.Knobs(jobs=200, counts=(1, 3), plain=True))
    t = res.table
    assert t is not None and list(zip(t["claim"], t["workers"], strict=True)) == [
        ("skip", 1), ("skip", 3), ("plain", 1), ("plain", 3)]
    # Every round ran every job exactly once (job_runs), whichever claim.
    assert (t["done"] == 200).all() and (t["runs"] == 200).all() and (t["duplicates"] == 0).all()
    m = res.measured
    assert set(m["jobs_per_s"]) == {"1", "3"} and m["duplicates"] == 0
    assert all(v > 0 for v in m["jobs_per_s"].values())
    # SKIP LOCKED: no claim was seen waiting; plain FOR UPDATE's claims queue on each other.
    assert m["claim_waits"] == {"1": 0, "3": 0}
    assert m["plain_for_update"]["claim_waits"]["3"] > 0
    # The re-check lock: the finish waits on the claim that re-checked its job, only then.
    r = m["recheck_lock"]
    assert r["recheck"]["blocked_by_b"] and r["recheck"]["b_claimed"] == [2]
    assert not r["control"]["finish_waited"]
    assert r["recheck"]["finish"] == r["control"]["finish"] == "done"
    # Behaviour, not timing: every check that reads no durations holds.
    assert all(c.ok for c in res.verdict.checks if not c.timing), res.verdict.line()
    assert workers.judge(m, res.knobs) == res.verdict


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
                                            "SKIP LOCKED: no claim waits on another claim",
                                            "the re-check lock"}
    assert set(m["lock_waits_by_kind"]["8"]) == set(workers.PAIRS)


def measured(skip_claim_waits: int = 0, skip_share: float = 0.01, plain_share: float = 0.2,
             plain_claim_waits: int = 30, recheck_waited: bool = True,
             control_waited: bool = False) -> dict:
    """A stored run's measured values, as the judge reads them (two counts, 1 and 4)."""
    def kinds(finish: float, claim: float) -> dict:
        return {"finish on claim": finish, "claim on claim": claim, "other": 0.0}

    def case(waited: bool, on_b: bool) -> dict:
        return {"a_claimed": 1, "b_claimed": [2], "finish_waited": waited,
                "wait_event": "transactionid" if waited else None, "blocked_by_b": on_b,
                "finish": "done"}

    return {
        "jobs_per_s": {"1": 100.0, "4": 250.0}, "duplicates": 0, "jobs": 400,
        "done": {"1": 400, "4": 400}, "claim_ms_p95": {"1": 5.0, "4": 9.0},
        "lock_wait_share": {"1": 0.0, "4": skip_share},
        "lock_waits_by_kind": {"1": kinds(0, 0), "4": kinds(skip_share, 0)},
        "claim_waits": {"1": 0, "4": skip_claim_waits},
        "recheck_lock": {"recheck": case(recheck_waited, recheck_waited),
                         "control": case(control_waited, control_waited)},
        "plain_for_update": {
            "jobs_per_s": {"1": 100.0, "4": 150.0}, "claim_ms_p95": {"1": 5.0, "4": 30.0},
            "lock_wait_share": {"1": 0.0, "4": plain_share},
            "lock_waits_by_kind": {"1": kinds(0, 0), "4": kinds(0.05, plain_share - 0.05)},
            "claim_waits": {"1": 0, "4": plain_claim_waits},
            "lock_wait_s": {"1": 0.0, "4": 1.0}, "done": {"1": 400, "4": 400}, "duplicates": 0},
    }


def failed(m: dict) -> list[str]:
    return [c.name for c in workers.judge(m).checks if not c.ok]


def test_judge_passes_what_the_finding_claims() -> None:
    v = workers.judge(measured())
    assert v.valid, v.line()
    timing = {c.name for c in v.checks if c.timing}
    assert timing == {"SKIP LOCKED waits far below plain FOR UPDATE's"}
    assert len(v.checks) - len(timing) >= 3  # behaviour judged apart from the clock


def test_judge_fails_with_the_cause_removed() -> None:
    # SKIP LOCKED off (claims waiting on claims, as plain FOR UPDATE's do): the check says so.
    assert failed(measured(skip_claim_waits=12, skip_share=0.2)) == [
        "SKIP LOCKED: no claim waits on another claim",
        "SKIP LOCKED waits far below plain FOR UPDATE's"]
    # No re-check lock seen, or a wait without the re-check: the demonstration fails.
    assert failed(measured(recheck_waited=False)) == ["the re-check lock"]
    assert failed(measured(control_waited=True)) == ["the re-check lock"]
    # A plain FOR UPDATE whose claims never queued: no lock queue to contrast with.
    assert failed(measured(plain_claim_waits=0, plain_share=0.0)) == [
        "SKIP LOCKED waits far below plain FOR UPDATE's", "plain FOR UPDATE: claims queue on claims"]


def test_judge_reads_a_run_stored_before_the_waits_were_named() -> None:
    old = measured()
    for key in ("lock_waits_by_kind", "claim_waits", "recheck_lock"):
        old.pop(key)
        old["plain_for_update"].pop(key, None)
    v = workers.judge(old)
    assert [c.name for c in v.checks] == [
        "every job ran, none twice", "SKIP LOCKED waits far below plain FOR UPDATE's",
        "plain FOR UPDATE: a lock queue"] and v.valid
