"""Notebook 08's report chart: the jobs the worker saw without and with the fix."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from . import common


def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart of what `reproduce` measured."""
    rows = [{"what": k.replace("_", " "), "jobs": m[k]}
            for k in ("total_jobs", "visible_without_tenant", "claimed", "visible_after_fix")
            if k in m]
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        y=alt.Y("what:N", sort=None, title=None), x="jobs:Q",
    ).properties(width=common.WIDTH, height=120)
