"""Charts and widgets of finding ``leak``: what the borrower saw after each job, per variant."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import leak

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
    """Return bars of the invoices each borrower saw, one panel per variant; leaks in red."""
    if df.empty:
        return alt.Chart(pd.DataFrame({"x": []})).mark_bar()
    b = borrowers(df)
    base = alt.Chart(b).encode(
        x=alt.X("job_mark:O", title="after job (✓ ok, ✗ failed)",
                sort=alt.EncodingSortField("job"), axis=alt.Axis(labelAngle=0)),
        y=alt.Y("invoices_seen:Q", title="invoices the borrower saw (it set no tenant)",
                scale=alt.Scale(domain=[0, 22000])),
        tooltip=["label", "after", "seen", "whose"],
    )
    color = alt.Color("leaked:N", title="borrower saw",
                      scale=alt.Scale(domain=[True, False], range=[LEAK, CLEAN]),
                      legend=alt.Legend(labelExpr="datum.value ? 'a leak' : 'nothing'"))
    bars = base.mark_bar().encode(color=color)
    text = base.mark_text(dy=-8, fontWeight="bold").encode(text="seen:N", color=color)
    return alt.layer(bars, text).properties(width=140, height=220).facet(
        column=alt.Column("label:N", title=None, sort=list(pd.unique(b.label))),
        title="What a job's successor sees without setting a tenant",
    ).resolve_scale(x="independent")


def verdict(summary: dict[str, Any]) -> str:
    """Return the verdict line for the article's four variants."""
    seen, expected = summary["seen_after_job"], leak.ARTICLE["seen_after_job"]
    ok = all(seen.get(v) == n for v, n in expected.items())
    return nb.verdict(ok, "; ".join(f"{v} {n}" for v, n in expected.items()),
                      "; ".join(f"{v} {seen.get(v)}" for v in expected))


def explorer() -> Any:
    """Return the widget: which job fails, autocommit, number of jobs; a Run button runs both forms."""
    import ipywidgets as w
    from IPython.display import display

    jobs = w.IntSlider(value=3, min=1, max=6, description="jobs")
    fail = w.Dropdown(options=_fail_options(3), value=2, description="failing job")
    auto = w.Checkbox(value=False, description="autocommit")
    def on_jobs(change: dict[str, Any]) -> None:
        keep = fail.value if fail.value is None or fail.value <= change["new"] else None
        fail.options = _fail_options(change["new"])
        fail.value = keep

    def run() -> None:
        variants = leak.variants_for(fail.value, auto.value)
        df, _ = leak.run(variants=variants, jobs=jobs.value)
        display(chart(df))
        for v in variants:
            print(v.label)
            display(leak.script(df, v.name))

    jobs.observe(on_jobs, names="value")
    return nb.run_panel([[jobs, fail, auto]], run)


def _fail_options(jobs: int) -> list[tuple[str, int | None]]:
    return [("none", None)] + [(f"job {j} (tenant {j})", j) for j in range(1, jobs + 1)]
