"""Finding crash: worker processes that really os._exit mid-job, the reaper, notebook 04."""

from __future__ import annotations

import pytest

from notebooks import run_clean
from tenantlab import db, reproduce
from tenantlab.experiments import crash

pytestmark = pytest.mark.slow


def test_crash_reproduces_with_real_processes(admin_dsn: str) -> None:
    res = crash.run(crash.Knobs(single_workers=3))
    single, leased = res.measured["single"], res.measured["leased"]
    assert (single["crashes"], single["status"], single["attempts"], single["next_job_ran"]) \
        == (3, "queued", 0, False)
    assert (leased["crashes"], leased["attempts"], leased["status_before_reap"]) \
        == (3, 3, "running")
    assert leased["lease_expired"] and leased["next_job_ran"]
    assert not leased["visible_right_after_crash"] and not leased["visible_while_lease_held"]
    assert leased["looks_while_lease_held"] >= 1
    assert leased["status_after_reap"] == "dead"
    assert res.verdict.valid and res.verdict.against == "the expectation"
    assert [c.ok for c in res.verdict.checks] == [True] * 8
    assert (res.events.event == "crash").sum() == 6
    assert (res.events.event == "reap").sum() == 1
    # The cause removed: a claim that commits before the work (the leased design's, measured in
    # this run) in place of the single transaction. Judged as the single run, it fails.
    without = crash.judge({"single": {"workers": leased["crashes"], "crashes": leased["crashes"],
                                      "status": leased["status_before_reap"],
                                      "attempts": leased["attempts"],
                                      "next_job_ran": leased["next_job_ran"]}})
    assert [c.name for c in without.checks if not c.ok] == [
        "single: the job after each crash", "single: the job behind it"]
    # Every worker process ended, and none left a session behind.
    assert not [b for b in db.leftover_backends(admin_dsn)
                if b["application_name"].startswith(("jobqueue single-", "jobqueue leased-"))]


def test_a_restart_within_the_lease_finds_the_job_invisible(admin_dsn: str) -> None:
    res = crash.run(crash.Knobs(designs=("leased",), lease=3.0, restart_after=0.0))
    leased = res.measured["leased"]
    # The next worker skipped the crashed job (lease still valid) and ran the one behind it.
    assert (leased["crashes"], leased["attempts"], leased["next_job_ran"]) == (1, 1, True)
    assert leased["status_before_reap"] == "running" and not leased["lease_expired"]
    assert leased["status_after_reap"] == "running"  # the reaper leaves a live lease alone
    assert res.verdict.valid and res.verdict.against == "the expectation"


def test_judge_fails_a_job_that_came_back_counted() -> None:
    m = {"single": {"workers": 4, "crashes": 4, "status": "queued", "attempts": 1,
                    "next_job_ran": False}}
    v = crash.judge(m, crash.Knobs())
    assert not v.valid and v.against == "the article"
    assert [c.name for c in v.checks if not c.ok] == ["single: the job after each crash"]


def test_reproduce_crash_keys(admin_dsn: str) -> None:
    out = reproduce.run(["crash"], echo=False)["findings"]["crash"]
    assert out["reproduced"] is True and out["verdict"]["valid"] is True
    assert set(out["measured"]["single"]) >= {"crashes", "status", "attempts", "workers",
                                              "next_job_ran"}
    assert set(out["measured"]["leased"]) >= {
        "crashes", "status_before_reap", "attempts", "next_job_ran", "status_after_reap",
        "lease_expired", "visible_right_after_crash"}


@pytest.mark.notebook
def test_notebook_04_runs_top_to_bottom(admin_dsn: str) -> None:
    _, text = run_clean("04-worker-crash.ipynb", admin_dsn)
    assert text.count("✓ as the article says") == 1 and "✗" not in text
