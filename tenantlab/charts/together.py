"""Charts of notebook 09: both designs' outcomes side by side, and a run with a live timeline."""

from __future__ import annotations

import time
from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import together
from . import palette, timeline

BAD = ["lost", "executed_twice", "wrong_tenant_rows", "worker_crashes"]


def outcomes(results: dict[str, together.Result]) -> alt.Chart:
    """Return bars per design: done, dead, and the things that must be zero (in red)."""
    rows = [{"design": d, "what": k.replace("_", " "), "jobs": r.summary[k],
             "bad": k in BAD and r.summary[k] > 0}
            for d, r in results.items()
            for k in ("done", "dead", *BAD)]
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        y=alt.Y("what:N", sort=None, title=None), x=alt.X("jobs:Q", title="count"),
        color=alt.condition(alt.datum.bad, alt.value(palette.NAIVE), alt.value(palette.NEUTRAL)),
        row=alt.Row("design:N", title=None, sort=list(together.DESIGNS)),
        tooltip=["design", "what", "jobs"],
    ).properties(width=420, height=130, title="what became of the queue")


def fetch_latency(results: dict[str, together.Result], window: int = 8) -> alt.Chart:
    """Return the probe's fetch time over the run, per design: a rolling median, so the trend
    (the naive queue's held horizon) shows through the spikes of a busy machine."""
    frames = []
    for d, r in results.items():
        ms = pd.Series(r.fetch_ms, dtype=float)
        frames.append(pd.DataFrame({"design": d, "seconds": ms.index * 0.25,
                                    "fetch ms (rolling median)":
                                    ms.rolling(window, min_periods=1).median()}))
    data = pd.concat(frames) if frames else pd.DataFrame(
        columns=["design", "seconds", "fetch ms (rolling median)"])
    return alt.Chart(data).mark_line().encode(
        x=alt.X("seconds:Q", title="seconds into the run"), y="fetch ms (rolling median):Q",
        color=alt.Color("design:N", title=None, legend=alt.Legend(orient="bottom"),
                        scale=alt.Scale(domain=list(together.DESIGNS),
                                        range=[palette.NAIVE, palette.CORRECTED])),
    ).properties(width=420, height=160, title="fetch time at the head of the queue")


def run_live(design: str, mix: together.Mix | None = None) -> together.Result:
    """Run one design with a live timeline and a progress bar (in a notebook)."""
    live = timeline.live(f"{design}: workers over time")
    nb.show(live)
    mix = mix or together.Mix()
    limit = mix.corrected_limit if design == "corrected" else mix.time_limit
    started = time.monotonic()
    with nb.progress(1, f"{design}") as bar:
        def step(settled: int, total: int) -> None:
            # A queue that never settles stops at its time limit: the note says which it was.
            bar.set(settled, total, f"{settled:,} of {total:,} jobs settled · "
                                    f"{time.monotonic() - started:.0f} s (stops at {limit:.0f} s)")
        return together.run(design, mix=mix, live=live, progress=step)


def show(results: dict[str, Any]) -> alt.VConcatChart:
    """Return the outcomes above the fetch times (stacked: both fit a laptop's output area)."""
    return alt.vconcat(outcomes(results), fetch_latency(results))
