"""Finding overrun with real worker processes: executions and completions per variant.

Durations sit far from every boundary (the machine is small and shared): the job runs 4 s
against a 2 s lease, the heartbeat beats every 0.4 s, the stuck attempt hangs 6 s past a 5 s
maximum runtime. What is asserted is behaviour: lines the outside world received, job_runs rows,
claims, fences; never how long anything took.
"""

from __future__ import annotations

import pandas as pd
import pytest

from notebooks import run_clean
from tenantlab import reproduce
from tenantlab.charts import overrun as charts
from tenantlab.experiments import overrun
from tenantlab.finding import Result

MARGINS = overrun.Knobs(lease=2.0, job=4.0, poll=0.1, heartbeat=0.4, max_runtime=5.0, hang=6.0)
EXPECTED = {  # variant: (executions, completions)
    "lease_only": (2, 2), "fence": (2, 1), "heartbeat": (1, 1), "stuck": (1, 1),
    "max_runtime": (2, 1),
}


@pytest.fixture(scope="module")
def result(admin_dsn: str) -> Result:
    return overrun.run(MARGINS)


def _row(result: Result, variant: str) -> pd.Series:
    assert result.table is not None
    return result.table.set_index("variant").loc[variant]


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(EXPECTED))
def test_executions_and_completions(result: Result, variant: str) -> None:
    row = _row(result, variant)
    assert (row.executions, row.completions) == EXPECTED[variant]
    assert row.status == "done"
    assert row.verdict == overrun.verdict_of(*EXPECTED[variant])
    assert row.as_expected  # the prediction for these settings agrees
    assert row.first_worker == "worker A"  # as in the notebook's script


@pytest.mark.slow
def test_verdict_is_against_the_expectation_at_other_durations(result: Result) -> None:
    assert result.verdict.valid and result.verdict.against == "the expectation"
    assert [c.name for c in result.verdict.checks] == [
        "lease only", "fenced finish", "heartbeat", "stuck, no maximum runtime",
        "stuck, maximum runtime"]


@pytest.mark.slow
def test_with_the_cause_removed_the_lease_only_check_fails(result: Result) -> None:
    # The cause removed: a lease that does not run out under the job (the heartbeat's run,
    # measured here) in place of the lease alone. Judged as the lease-only run, it fails.
    m = {key: {**value, "lease_only": value["heartbeat"]}
         if isinstance(value, dict) and "heartbeat" in value else value
         for key, value in result.measured.items()}
    without = overrun.judge(m, MARGINS)
    assert [c.name for c in without.checks if not c.ok] == ["lease only"], without.line()


@pytest.mark.slow
def test_lease_only_both_executions_wrote(result: Result) -> None:
    row = _row(result, "lease_only")
    assert row.db_runs == 2 and row.completions == 2 and row.fenced == 0
    assert row.taken_over and row.overlap_s > 0 and row.attempts == 2


@pytest.mark.slow
def test_fence_rolls_back_the_late_write_but_not_the_world(result: Result) -> None:
    row = _row(result, "fence")
    assert row.fenced == 1
    assert row.db_runs == 1  # the fenced execution's job_runs row rolled back with it
    assert len(row.outside) == 2  # the outside world saw both
    assert sorted(a.split()[-1] for a in row.outside) == ["1", "2"]


@pytest.mark.slow
def test_heartbeat_keeps_the_job_with_its_worker(result: Result) -> None:
    row = _row(result, "heartbeat")
    assert row.beats > 0 and not row.taken_over and row.claims == 1 and row.attempts == 1
    assert row.abandoned == 0 and row.lease_lost == 0


@pytest.mark.slow
def test_stuck_worker_keeps_beating_and_is_never_taken_over(result: Result) -> None:
    row = _row(result, "stuck")
    assert row.beats > 0 and not row.taken_over and row.claims == 1 and row.abandoned == 0


@pytest.mark.slow
def test_max_runtime_abandons_then_takeover_and_fence(result: Result) -> None:
    row = _row(result, "max_runtime")
    assert row.abandoned == 1 and row.taken_over and row.claims == 2
    assert row.fenced == 1 and row.db_runs == 1 and row.attempts == 2
    assert result.events is not None
    ev = result.events[result.events.variant == "max_runtime"]
    first = ev[(ev.event == "claim") & (ev.attempt == 1)].worker.iloc[0]
    assert first == "worker A"
    mine = ev[ev.worker == first]
    # The stuck worker: beats, then abandons, then (much later) its finish is fenced.
    order = list(mine.event)
    assert order.index("abandon") < order.index("fenced")
    assert "heartbeat" not in order[order.index("abandon"):]
    assert result.measured["as_article"] == {v: True for v in EXPECTED}


@pytest.mark.slow
def test_segments_show_both_workers_overlap_and_lease_expiry(result: Result) -> None:
    segs = result.data["segments"]
    seg = segs[segs.variant == "fence"]
    assert set(seg.worker) == set(overrun.WORKERS)
    assert (seg.kind == "overlap").sum() == 2  # one bar on each worker's row
    assert (seg.kind == "expired").any()
    assert sorted(seg[seg.kind == "execution"].outcome) == ["done", "fenced"]
    assert charts.chart(seg).to_dict()["layer"]  # draws without a browser
    hb = segs[segs.variant == "heartbeat"]
    assert len(hb[hb.kind == "heartbeat"]) == _row(result, "heartbeat").beats
    # Worker B never claims in the heartbeat run, yet it has a row: it polls.
    assert set(hb[hb.kind == "polling"].worker) == set(overrun.WORKERS)


@pytest.mark.slow
def test_combined_runs_are_judged_once_against_the_article(admin_dsn: str) -> None:
    """Runs of single variants (the notebook's sections) judged as one: the article's setup."""
    runs = [overrun.run(overrun.Knobs(variants=(v,))) for v in ("fence", "heartbeat")]
    both = overrun.combine(runs)
    assert both.knobs == overrun.Knobs(variants=("fence", "heartbeat"))
    assert both.verdict.valid and both.measured["executions"] == {"fence": 2, "heartbeat": 1}
    assert both.data["segments"].variant.nunique() == 2


def test_judge_at_the_article_setup_needs_every_variant() -> None:
    m = {"executions": {"fence": 2}, "completions": {"fence": 1}, "verdicts": {"fence": "x"},
         "beats": {"fence": 0}, "abandoned": {"fence": 0}, "taken_over": {"fence": True},
         "fenced": {"fence": 1}, "settings": overrun.Knobs().seconds()}
    v = overrun.judge(m, overrun.Knobs())
    assert v.against == "the article" and not v.valid
    assert [c.name for c in v.checks if not c.ok] == ["every variant ran"]
    m["completions"]["fence"] = 2  # an unfenced late write: not the article's fence
    assert not overrun.judge(m, overrun.Knobs(variants=("fence",))).checks[0].ok


def test_gantt_has_both_worker_rows_and_one_legend_entry_per_colour() -> None:
    spec = charts.chart(overrun.segments([], t0=0.0, now=1.0)).to_dict()
    layers = [layer["encoding"] for layer in spec["layer"]]
    assert all(e["y"]["scale"]["domain"] == list(overrun.WORKERS) for e in layers)
    colours = layers[0]["color"]["scale"]["range"]
    assert len(set(colours)) == len(colours)


def test_expectations_follow_the_knobs() -> None:
    s = overrun.Knobs()
    v = overrun.BY_NAME
    assert overrun.expect(v["lease_only"], s)[0] == "ran twice"
    assert overrun.expect(v["fence"], s)[0] == "fenced: one write, two executions"
    assert overrun.expect(v["heartbeat"], s)[0] == "one execution"
    assert overrun.expect(v["stuck"], s)[0] == "one execution"
    assert overrun.expect(v["max_runtime"], s)[0] == "fenced: one write, two executions"
    assert overrun.expect(v["lease_only"], overrun.Knobs(job=1.0))[0] == "one execution"
    assert overrun.expect(v["lease_only"], overrun.Knobs(job=2.05))[0] is None
    table = charts.expectations()
    assert "refused" in set(table.expected) and "too close to call" in set(table.expected)
    assert "…" not in charts.expectations_table().to_html()


def test_bad_variant_and_knobs_are_refused() -> None:
    with pytest.raises(overrun.OverrunError, match="valid: lease_only, fence"):
        overrun.run(overrun.Knobs(variants=("nope",)))
    with pytest.raises(overrun.OverrunError, match="lease must be a positive"):
        overrun.Knobs(lease=0)
    assert overrun.Knobs.full() == overrun.Knobs()  # the article's experiment is this size


def test_explorer_sliders_come_from_the_knobs() -> None:
    ex = charts.Explorer()
    assert set(ex.sliders) == {"lease", "heartbeat", "job", "poll", "max_runtime", "hang"}
    assert ex.lease.value == overrun.Knobs().lease and ex.lease.layout.width == "400px"
    assert ex.hang.disabled  # not stuck: how long it would hang does not matter
    ex.use_heartbeat.value = False  # no heartbeat: no maximum runtime either
    assert ex.use_max_runtime.disabled and ex.max_runtime.disabled and ex.heartbeat.disabled
    assert not ex.knobs().variants[0].max_runtime


def test_explorer_refuses_a_heartbeat_as_long_as_the_lease() -> None:
    ex = charts.Explorer()
    ex.lease.value, ex.heartbeat.value = 2.0, 2.0
    assert "refused" in ex.note.value and "shorter than the lease" in ex.note.value
    assert ex.button.disabled
    assert ex.run() is None and ex.live.updates == 0


@pytest.mark.slow
def test_explorer_run_button_runs_and_redraws(admin_dsn: str) -> None:
    ex = charts.Explorer()
    # A job well inside its lease, fenced, no heartbeat: one execution, quickly.
    ex.use_heartbeat.value = False
    ex.lease.value, ex.job.value, ex.poll.value = 3.0, 1.0, 0.1
    assert "expected: one execution" in ex.note.value
    result = ex.run()
    assert result is not None and result.table is not None
    row = result.table.iloc[0]
    assert (row.executions, row.completions) == (1, 1)
    assert result.verdict.valid and result.verdict.against == "the expectation"
    assert ex.live.updates > 0
    kinds = set(ex.live.data["kind"])
    assert {"execution", "lease", "claim", "finish", "outside", "polling"} <= kinds
    assert ex.live.chart.to_dict()["layer"]
    assert "as the expectation says" in ex.note.value and not ex.button.disabled


@pytest.mark.slow
def test_reproduce_overrun_keys(admin_dsn: str) -> None:
    out = reproduce.run(["overrun"], echo=False)["findings"]["overrun"]
    assert out["reproduced"] is True and out["verdict"]["valid"] is True
    assert out["verdict"]["against"] == "the article"
    assert set(out["measured"]) >= {"executions", "completions", "verdicts", "beats",
                                    "abandoned", "taken_over", "overlap_s", "settings",
                                    "as_article"}
    assert out["measured"]["as_article"] == {v: True for v in EXPECTED}
    assert out["measured"]["settings"] == overrun.Knobs().seconds()


@pytest.mark.notebook
def test_notebook_05_runs_top_to_bottom(admin_dsn: str) -> None:
    _, text = run_clean("05-lease-overrun.ipynb", admin_dsn)
    assert text.count("✓ as the article says") == 1
    assert "✗" not in text
    assert "refused: heartbeat interval (2 s) must be shorter than the lease (2 s)" in text
