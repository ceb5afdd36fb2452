"""Charts and widgets of finding ``reset``: cost per job and connections opened, traps marked."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import reset
from . import common

# The kit's two colours: red for the naive design and the traps, green for the correct ones.
KINDS = {"naive or trap": "#d62728", "correct": "#2ca02c"}
KIND_SCALE = alt.Scale(domain=list(KINDS), range=list(KINDS.values()))
ORDER = [v.label for v in reset.VARIANTS]
LABELS = {v.name: v.label for v in reset.VARIANTS}


def _kind(variant: str) -> str:
    v = next(v for v in reset.VARIANTS if v.name == variant)
    return "naive or trap" if v.trap else "correct"


def _marked(table: pd.DataFrame) -> pd.DataFrame:
    t = table.copy()
    t["kind"] = t.variant.map(_kind)
    ratio = t["ratio_to_leaky"] if "ratio_to_leaky" in t else pd.Series([None] * len(t))
    t["cost"] = [f"{ms:.2f} ms ({r:.1f}×)" if pd.notna(r) else f"{ms:.2f} ms"
                 for ms, r in zip(t.ms_per_job, ratio, strict=True)]
    t["trap_note"] = [
        f"{trap}: first at job {first}" if pd.notna(first) else trap
        for trap, first in zip(t.trap, t.first_failure.astype("Int64"), strict=True)
    ]
    t["opened"] = [f"{int(c)} for {int(j)} jobs" for c, j in
                   zip(t.connections_opened, t.jobs_run, strict=True)]
    return t


def chart(table: pd.DataFrame) -> alt.TopLevelMixin:
    """Return two panels, one above the other: median ms per job, connections the pool opened."""
    if table.empty:
        return alt.Chart(pd.DataFrame({"x": []})).mark_bar()
    t = _marked(table)
    # Stacked, not side by side: both panels fit a 1280 px JupyterLab with the file browser open.
    y = alt.Y("label:N", title=None, sort=ORDER, axis=alt.Axis(labelLimit=260))
    color = alt.Color("kind:N", title=None, scale=KIND_SCALE, legend=alt.Legend(orient="top"))
    tip = ["label", "cost", "opened", "trap_note", "failed_jobs", "jobs_counted"]
    cost = alt.Chart(t).encode(y=y, x=alt.X("ms_per_job:Q", title="median ms per job"),
                               tooltip=tip)
    top = (cost.mark_bar().encode(color=color)
           + cost.mark_text(align="left", dx=4).encode(text="cost:N")
           ).properties(width=360, height=170, title=(
               "What a job costs: median ms, × the leaky one "
               f"(about as cheap: at most {reset.CHEAP_RATIO}×)"))
    conns = alt.Chart(t).encode(
        y=y, x=alt.X("connections_opened:Q", title="connections opened (first run)"),
        tooltip=tip)
    bottom = (conns.mark_bar().encode(color=color)
              + conns.mark_text(align="left", dx=4).encode(text="opened:N")
              ).properties(width=360, height=170, title="Connections the pool opened")
    return alt.vconcat(top, bottom)


def per_job(df: pd.DataFrame, first: int = 60) -> alt.TopLevelMixin:
    """Return ms per job over the first jobs of run 1, one row per variant; ✚ a failed job."""
    d = df[(df.run == 1) & (df.job <= first)].copy()
    d["label"] = d.variant.map(LABELS)
    d["kind"] = d.variant.map(_kind)
    d["failed"] = d.error.notna()
    x = alt.X("job:Q", title="job")
    y = alt.Y("ms:Q", title="ms (log)", scale=alt.Scale(type="log"))
    tip = ["label", "job", alt.Tooltip("ms:Q", format=".2f"), "error"]
    lines = alt.Chart().mark_line(point=alt.OverlayMarkDef(size=12)).encode(
        x=x, y=y, tooltip=tip,
        color=alt.Color("kind:N", title=None, scale=KIND_SCALE, legend=alt.Legend(orient="top")))
    crosses = alt.Chart().mark_point(shape="cross", size=120, filled=True,
                                     color=KINDS["naive or trap"]).encode(
        x=x, y=y, tooltip=tip).transform_filter(alt.datum.failed)
    return alt.layer(lines, crosses, data=d).properties(width=560, height=55).facet(
        row=alt.Row("label:N", title=None, sort=[v.label for v in reset.VARIANTS],
                    header=alt.Header(labelAngle=0, labelOrient="top", labelAnchor="start",
                                      labelFontWeight="bold")),
        title="Each job's cost in run 1; ✚ a job that failed, spikes are new connections",
    ).resolve_scale(y="shared")


def run_with_progress(knobs: reset.Knobs) -> Any:
    """Run the cost experiment with a progress bar and a chart that fills in as variants end."""
    live = nb.LiveChart(chart)
    nb.show(live)
    with nb.progress(reset.total_jobs(knobs), "jobs") as bar:
        return reset.run(knobs, progress=bar, live=live)


def sizes(knobs: reset.Knobs) -> Any:
    """Return the run's sizes as a two-column table."""
    k = knobs
    return _pairs([
        ("jobs per variant and run", k.jobs), ("first jobs not counted", k.warmup),
        ("runs", k.runs), ("jobs of RESET without commit (a new connection each)", k.churn_jobs),
        ("its first jobs not counted", k.churn_warmup),
        ("psycopg prepare_threshold", k.prepare_threshold),
    ], "this run")


def discard_all(res: Any) -> Any:
    """Return where the DISCARD ALL jobs failed, and why, as a two-column table."""
    m = res.measured
    return _pairs([
        ("first failure (run 1), at job", m["discard_all_failed_at_job"]),
        ("expected at job (prepare_threshold + 2)", m["discard_all_expected_at_job"]),
        ("the error", m["discard_all_error"]),
        ("failed jobs, per run (the first six)", "; ".join(
            ", ".join(str(j) for j in jobs) for jobs in m["discard_all_failures_per_run"])),
    ], "measured here")


def open_tx(res: Any) -> Any:
    """Return what RESET without commit cost: connections, jobs, warnings (with examples)."""
    m, name = res.measured, "reset_open_tx"
    rows: list[tuple[str, Any]] = [
        ("connections opened (run 1)", m["connections_opened"][name]),
        ("jobs (run 1)", m["jobs_run"][name]),
        ("pool warnings (run 1)", m["pool_warnings"][name]),
    ]
    rows += [("a warning", w) for w in m["pool_warning_examples"].get(name, [])]
    return _pairs(rows, "measured here")


def threshold_explorer() -> Any:
    """Return a prepare_threshold slider (from the knobs) and Run: 40 DISCARD ALL jobs traced."""
    from IPython.display import display

    widgets = nb.controls(reset.Knobs.of(nb.full()))

    def run() -> None:
        display(trace(reset.trace_discard_all(widgets["prepare_threshold"].value, jobs=40)))

    return nb.run_panel([list(widgets.values())], run, "Run 40 jobs")


def trace(t: dict[str, Any]) -> Any:
    """Return a DISCARD ALL trace as a two-column table."""
    return _pairs([
        ("prepare_threshold", t["prepare_threshold"]), ("jobs", t["jobs"]),
        ("jobs that failed", ", ".join(str(j) for j in t["failed_jobs"]) or "none"),
        ("first failure expected at job", t["expected_first"] or "never"),
        ("first error", t["first_error"]),
        ("connections the pool opened", t["connections_opened"]),
        *(("the reset failed", e) for e in t["reset_errors"]),
    ], "measured here")


def table(res: Any) -> pd.DataFrame:
    """Return the measurement as one row per variant: ms, ratio to leaky, connections opened."""
    m = res.measured
    return pd.DataFrame({
        "variant": {n: LABELS[n] for n in m["ms_per_job"]},
        "median ms per job": m["ms_per_job"],
        "× leaky": m["ratio_to_leaky"],
        "median ms, per run": {n: ", ".join(f"{x:.3f}" for x in v if x is not None)
                               for n, v in m["ms_per_job_per_run"].items()},
        "connections opened (run 1)": m["connections_opened"],
        "jobs (run 1)": m["jobs_run"],
    }).reset_index(drop=True)


def _pairs(rows: list[tuple[str, Any]], column: str) -> Any:
    # Long values (errors, warnings) wrap inside the output instead of widening it.
    df = pd.DataFrame([{"what": w, column: "—" if v is None else str(v)} for w, v in rows],
                      columns=["what", column])
    return df.style.hide(axis="index").set_properties(
        **{"text-align": "left", "white-space": "normal", "overflow-wrap": "anywhere"})


def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart of what `reproduce` measured."""
    opened = m.get("connections_opened", {})
    rows = [{"variant": v, "ms per job": ms, "connections opened": opened.get(v)}
            for v, ms in m["ms_per_job"].items() if ms is not None]
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        y=alt.Y("variant:N", sort="-x", title=None), x="ms per job:Q",
        tooltip=["variant", "ms per job", "connections opened"],
    ).properties(width=common.WIDTH, height=160)
