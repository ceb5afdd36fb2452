"""Charts and widgets of finding ``leak``: what the borrower saw after each job, per run."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import leak

# The kit's two colours: red for the naive design's failure (a leak), green for a clean result.
LEAK, CLEAN = "#d62728", "#2ca02c"


def borrowers(df: pd.DataFrame) -> pd.DataFrame:
    """Return one row per borrower: the variant, the job it followed, what it saw and why."""
    b = df[df.actor == "borrower"].copy()
    jobs = df[df.actor == "job"].set_index(["variant", "job"])
    b["after"] = [f"after job {j} ({jobs.loc[(v, j), 'outcome'].split(':')[0]})"
                  for v, j in zip(b.variant, b.job, strict=True)]
    b["job_mark"] = [f"{j} {'✗' if 'failed' in jobs.loc[(v, j), 'outcome'] else '✓'}"
                     for v, j in zip(b.variant, b.job, strict=True)]
    b["seen"] = b.invoices_seen.map(lambda n: f"{n:,}")
    b["whose"] = [f"tenant {int(c)}'s invoices" if n else "nothing: no tenant set"
                  for c, n in zip(b.context, b.invoices_seen, strict=True)]
    return b


def chart(df: pd.DataFrame) -> alt.TopLevelMixin:
    """Return bars of the invoices each borrower saw, one panel per run; leaks in red."""
    if df.empty:
        return alt.Chart(pd.DataFrame({"x": []})).mark_bar()
    b = borrowers(df)
    panels = len(pd.unique(b.label))
    base = alt.Chart(b).encode(
        x=alt.X("job_mark:O", title="after job (✓ ok, ✗ failed)",
                sort=alt.EncodingSortField("job"), axis=alt.Axis(labelAngle=0)),
        y=alt.Y("invoices_seen:Q", title="invoices the borrower saw",
                scale=alt.Scale(domain=[0, 22000])),
        tooltip=["label", "after", "seen", "whose"],
    )
    color = alt.Color("leaked:N", title="the borrower (it set no tenant) saw",
                      scale=alt.Scale(domain=[True, False], range=[LEAK, CLEAN]),
                      legend=alt.Legend(orient="bottom",
                                        labelExpr="datum.value ? 'a leak' : 'nothing'"))
    bars = base.mark_bar().encode(color=color)
    small = b.job.max() > 4  # six bars to a panel: smaller numbers, or they run together
    text = base.mark_text(dy=-8, fontWeight="bold", fontSize=8 if small else 10).encode(
        text="seen:N", color=color)
    # Four panels must fit a 1280 px JupyterLab with the file browser open (about 800 px).
    width = max(90, min(150, 620 // max(panels, 1)))
    return alt.layer(bars, text).properties(width=width, height=200).facet(
        column=alt.Column("label:N", title=None, sort=list(pd.unique(b.label)),
                          header=alt.Header(labelFontSize=11, labelExpr="split(datum.value, ', ')")),
        title="What a job's successor sees without setting a tenant",
    ).resolve_scale(x="independent")


def explorer() -> Any:
    """Return sliders for the jobs and the failing job, and Run: the article's four runs."""
    from IPython.display import display

    widgets = nb.controls(leak.Knobs.of(nb.full()))
    jobs, fail = widgets["jobs"], widgets["fail_job"]

    def on_jobs(change: dict[str, Any]) -> None:
        fail.max = change["new"]  # the failing job is one of the jobs

    def run() -> None:
        knobs = leak.Knobs.of(nb.full(), jobs=jobs.value, fail_job=fail.value)
        res = leak.run(knobs)
        display(chart(res.table))
        display(res.verdict)

    fail.max = jobs.value
    jobs.observe(on_jobs, names="value")
    return nb.run_panel([[jobs, fail]], run)


def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart of what `reproduce` measured."""
    rows = [{"variant": v, "after job": i + 1, "rows seen by the next borrower": n}
            for v, seen in m["seen_after_job"].items() for i, n in enumerate(seen)]
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        x=alt.X("after job:O"), y="rows seen by the next borrower:Q",
        color=alt.condition(alt.datum["rows seen by the next borrower"] > 0,
                            alt.value("#d62728"), alt.value("#2ca02c")),
        column=alt.Column("variant:N", title=None),
    ).properties(width=90, height=160)
