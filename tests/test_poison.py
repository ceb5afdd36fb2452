"""Finding poison: the experiment with real worker processes, and notebook 03."""

from __future__ import annotations

import pytest

from notebooks import run_clean
from tenantlab import reproduce
from tenantlab.experiments import poison

pytestmark = pytest.mark.slow


def test_poison_reproduces_with_real_workers(admin_dsn: str) -> None:
    res = poison.run(poison.Knobs(fetches=10, max_attempts=3))
    s = res.measured
    assert (s["unhandled"]["picked"], s["unhandled"]["attempts"],
            s["unhandled"]["job_runs"], s["unhandled"]["next_job_ran"]) == (10, 0, 0, False)
    assert (s["handled"]["status"], s["handled"]["attempts"], s["handled"]["next_job_ran"]) \
        == ("dead", 3, True)
    assert (s["leased"]["status"], s["leased"]["attempts"], s["leased"]["next_job_ran"]) \
        == ("dead", 3, True)
    assert res.verdict.valid and res.verdict.against == "the article"
    assert [c.ok for c in res.verdict.checks] == [True] * 7
    # Every claim the worker made is on the timeline; the unhandled ones left no row behind.
    claims = res.events[(res.events.worker == "unhandled") & (res.events.event == "claim")]
    assert len(claims) == 10
    # The cause removed: a claim that counts the attempt (the leased design's, measured in this
    # run) in place of the unhandled one. Judged as the unhandled run, its checks fail.
    without = poison.judge({"unhandled": {**s["leased"], "fetches": 10}})
    assert [c.name for c in without.checks if not c.ok] == [
        "unhandled: picked every fetch", "unhandled: never counted",
        "unhandled: the job behind it"]


def test_poison_max_attempts_is_a_knob(admin_dsn: str) -> None:
    res = poison.run(poison.Knobs(fetches=6, max_attempts=2, variants=("handled",),
                                  backoff=False))
    s = res.measured
    assert res.verdict.valid and res.verdict.against == "the expectation"
    assert (s["handled"]["status"], s["handled"]["attempts"], s["handled"]["picked"]) \
        == ("dead", 2, 2)


def test_reproduce_poison_keys(admin_dsn: str) -> None:
    out = reproduce.run(["poison"], echo=False)["findings"]["poison"]
    assert out["reproduced"] is True
    assert out["verdict"]["valid"] is True
    assert set(out["measured"]["unhandled"]) >= {"picked", "attempts", "job_runs", "next_job_ran"}
    assert set(out["measured"]["handled"]) >= {"status", "attempts", "next_job_ran"}


@pytest.mark.notebook
def test_notebook_03_runs_top_to_bottom(admin_dsn: str) -> None:
    _, text = run_clean("03-poison-pill.ipynb", admin_dsn)
    assert "✓ as the article says" in text and "✗" not in text

