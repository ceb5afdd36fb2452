"""What every finding's charts share: the report's bar chart and the width it is drawn at."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

#: The report page's chart width (px).
WIDTH = 420


def bars(rows: list[dict[str, Any]], group: str, what: str, n: str) -> alt.Chart:
    """Return horizontal bars of `n` per `what`, one small panel per `group`."""
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        y=alt.Y(f"{what}:N", title=None), x=f"{n}:Q", color=alt.Color(f"{what}:N", legend=None),
        row=alt.Row(f"{group}:N", title=None),
    ).properties(width=WIDTH - 100, height=60)
