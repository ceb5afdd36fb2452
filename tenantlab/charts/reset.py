"""Charts and widgets of finding ``reset``: cost per job and connections opened, traps marked."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import reset

KIND_COLORS = {"correct": "#2ca02c", "leaks": "#ff7f0e", "trap": "#d62728"}
ORDER = [v.label for v in reset.VARIANTS]


def _kind(variant: str) -> str:
    v = next(v for v in reset.VARIANTS if v.name == variant)
    return "leaks" if v.name == "leaky" else "trap" if v.trap else "correct"


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
    t["cost_note"] = [f"{c}  {n}" if n else c for c, n in zip(t.cost, t.trap_note, strict=True)]
    t["opened"] = [f"{int(c)} for {int(j)} jobs" for c, j in
                   zip(t.connections_opened, t.jobs_run, strict=True)]
    return t


def chart(table: pd.DataFrame) -> alt.TopLevelMixin:
    """Return two panels: median ms per job, and connections the pool opened (first run)."""
    if table.empty:
        return alt.Chart(pd.DataFrame({"x": []})).mark_bar()
    t = _marked(table)
    y = alt.Y("label:N", title=None, sort=ORDER, axis=alt.Axis(labelLimit=320))
    color = alt.Color("kind:N", title=None, scale=alt.Scale(
        domain=list(KIND_COLORS), range=list(KIND_COLORS.values())))
    tip = ["label", "cost", "opened", "trap_note", "failed_jobs", "jobs_counted"]
    cost = alt.Chart(t).encode(y=y, x=alt.X("ms_per_job:Q", title="median ms per job"),
                               tooltip=tip)
    left = (cost.mark_bar().encode(color=color)
            + cost.mark_text(align="left", dx=4).encode(text="cost_note:N")
            ).properties(width=380, height=200, title="What a job costs (median, ratio to leaky)")
    conns = alt.Chart(t).encode(
        y=y, x=alt.X("connections_opened:Q", title="connections opened (first run)"),
        tooltip=tip)
    right = (conns.mark_bar().encode(color=color)
             + conns.mark_text(align="left", dx=4).encode(text="opened:N")
             ).properties(width=230, height=200, title="Connections the pool opened")
    return alt.hconcat(left, right.encode(
        y=alt.Y("label:N", title=None, sort=ORDER, axis=None)))


def per_job(df: pd.DataFrame, first: int = 60) -> alt.TopLevelMixin:
    """Return ms per job over the first jobs of run 1, failed jobs marked with a red cross."""
    d = df[(df.run == 1) & (df.job <= first)].copy()
    d["label"] = d.variant.map({v.name: v.label for v in reset.VARIANTS})
    d["failed"] = d.error.notna()
    base = alt.Chart(d).encode(
        x=alt.X("job:Q", title="job"),
        y=alt.Y("ms:Q", title="ms (log scale)", scale=alt.Scale(type="log")),
        color=alt.Color("label:N", title=None, sort=ORDER, legend=alt.Legend(labelLimit=320)),
        tooltip=["label", "job", alt.Tooltip("ms:Q", format=".2f"), "error"],
    )
    lines = base.mark_line(point=alt.OverlayMarkDef(size=12), opacity=0.7)
    crosses = alt.Chart(d[d.failed]).mark_point(
        shape="cross", size=160, color=KIND_COLORS["trap"], filled=True).encode(
        x="job:Q", y="ms:Q", tooltip=["label", "job", "error"])
    return (lines + crosses).properties(
        width=600, height=220, title="Each job's cost (run 1); ✚ a job that failed")


def verdict(measured: dict[str, Any]) -> str:
    """Return the verdict line: the behaviours judged, not the absolute milliseconds."""
    checks = reset.judge(measured)
    bad = [k for k, ok in checks.items() if not ok]
    m = measured
    return nb.verdict(
        not bad,
        "DISCARD ALL fails at job 7 with _pg3_0, works unprepared; RESET without commit opens a "
        "connection per job; local form about as cheap as leaky",
        f"DISCARD ALL failed at job {m['discard_all_failed_at_job']}; unprepared failures "
        f"{m['discard_all_unprepared_failures']}; open transaction: "
        f"{m['connections_opened'].get('reset_open_tx')} connections for "
        f"{m['jobs_run'].get('reset_open_tx')} jobs; local {m['ratio_to_leaky'].get('local')}× "
        f"leaky" + (f" (failed: {', '.join(bad)})" if bad else ""),
    )


def run_with_progress(full: bool = False) -> tuple[pd.DataFrame, dict[str, Any], Any]:
    """Run the cost experiment with a progress bar and a chart that fills in as variants end."""
    live = nb.LiveChart(chart)
    nb.show(live)
    with nb.progress(reset.total_jobs(full), "jobs") as bar:
        df, measured = reset.run(full=full, progress=bar, live=live)
    return df, measured, live


def threshold_explorer() -> Any:
    """Return the widget: pick prepare_threshold, Run, see which DISCARD ALL jobs fail."""
    import ipywidgets as w
    from IPython.display import display

    threshold = w.IntSlider(value=5, min=0, max=10, description="threshold")
    off = w.Checkbox(value=False, description="prepare_threshold=None")
    def run() -> None:
        trace = reset.trace_discard_all(None if off.value else threshold.value, jobs=40)
        display(pd.Series(trace, name="DISCARD ALL reset").to_frame())

    return nb.run_panel([[threshold, off]], run, "Run 40 jobs")


def table(measured: dict[str, Any]) -> pd.DataFrame:
    """Return the measurement as one row per variant: ms, ratio, connections per run."""
    labels = {v.name: v.label for v in reset.VARIANTS}
    m = measured
    return pd.DataFrame({
        "variant": {n: labels[n] for n in m["ms_per_job"]},
        "median ms per job": m["ms_per_job"],
        "ratio to leaky": m["ratio_to_leaky"],
        "ms per run": m["ms_per_job_per_run"],
        "connections opened": m["connections_opened"],
        "jobs per run": m["jobs_run"],
        "pool warnings": m["pool_warnings"],
    })
