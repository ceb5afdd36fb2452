"""Notebook 12's charts: process B's reads under another process's tenant, through PgBouncer."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..finding import Result
from . import common, palette

LEAK, CLEAN = "#d62728", "#2ca02c"
FORMS = ["session", "local"]


def chart(df: pd.DataFrame) -> alt.TopLevelMixin:
    """Return B's reads so far, one line per form: how many ran under a tenant B never set."""
    if df.empty:
        df = pd.DataFrame({"form": FORMS, "read": [0, 0], "wrong_so_far": [0, 0],
                           "tenant": [None, None], "invoices": [0, 0]})
    colour = alt.Color("form:N", title="A sets its tenant in the",
                       scale=alt.Scale(domain=FORMS, range=[LEAK, CLEAN]),
                       legend=alt.Legend(labelExpr="datum.value + ' form'"))
    return alt.Chart(df).mark_line(point=True, interpolate="step-after").encode(
        x=alt.X("read:Q", title="process B's reads (it sets no tenant)"),
        y=alt.Y("wrong_so_far:Q", title="reads under another process's tenant, so far"),
        color=colour,
        tooltip=["form", "read", "tenant", "invoices", "wrong_so_far"],
    ).properties(width=520, height=240,
                 title="Through PgBouncer: B reads under A's tenant (session form) or never (local)")


def live() -> nb.LiveChart:
    """Return the chart that redraws while the processes run."""
    return nb.LiveChart(chart, pd.DataFrame())


def explorer() -> Any:
    """Return sliders for pool size, processes, reads and jobs, a Run button, the live chart."""
    return nb.explorer("pgbouncer", _table, live=live)


def _table(res: Result) -> Any:
    return nb.table(res.table if res.table is not None else pd.DataFrame())


def measured_rates(res: Result) -> pd.DataFrame:
    """Return the corrected worker's runs, direct and through PgBouncer, as a table."""
    runs = res.measured.get("corrected_worker", {})
    return pd.DataFrame([{"connection": how, **values} for how, values in runs.items()],
                        columns=["connection", "jobs", "done", "wrong_counts", "jobs_per_s"])



def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart: B's reads under A's tenant, session form vs local form."""
    rows = [{"form": label, "reads under another process's tenant": m[key]["wrong_tenant_reads"],
             "reads": m[key]["reads"]}
            for key, label in (("session_form", "session form"), ("local_form", "local form"))
            if isinstance(m.get(key), dict)]
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        y=alt.Y("form:N", title=None), x="reads under another process's tenant:Q",
        color=alt.Color("form:N", legend=None, scale=alt.Scale(
            domain=["session form", "local form"], range=[palette.NAIVE, palette.CORRECTED])),
        tooltip=["form", "reads", "reads under another process's tenant"],
    ).properties(width=common.WIDTH, height=80)
