"""Notebook 04's explorer: the crash finding's knobs over a live timeline."""

from __future__ import annotations

from typing import Any

import altair as alt

from .. import nb
from ..finding import Result
from . import common, timeline


def explorer() -> Any:
    """Return sliders for max attempts (crashes), lease, restart delay and single workers."""
    return nb.explorer("crash", _table, live=lambda: timeline.live("crash: one worker process per row"),
                       per_row=2)


def _table(res: Result) -> Any:
    """Return the run's table, one row per worker process, without the index column."""
    assert res.table is not None  # crash.run always fills it
    return res.table.style.hide(axis="index")


def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart of what `reproduce` measured."""
    rows = [{"design": d, "what": k, "n": v} for d in ("single", "leased")
            for k, v in m[d].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return common.bars(rows, "design", "what", "n")
