"""Notebook 03's explorer: the poison finding's knobs over a live timeline."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..finding import Result
from . import common, timeline


def explorer() -> Any:
    """Return sliders for max attempts and fetches, a backoff switch, and a Run button."""
    return nb.explorer("poison", lambda res: _table(res),
                       live=lambda: timeline.live("poison: one worker per variant"))


def _table(res: Result) -> pd.DataFrame:
    assert res.table is not None
    return res.table.drop(columns=["label"])


def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart of what `reproduce` measured."""
    rows = [{"design": "unhandled", "what": "picked", "n": m["unhandled"]["picked"]},
            {"design": "unhandled", "what": "attempts counted", "n": m["unhandled"]["attempts"]},
            {"design": "handled", "what": "attempts counted", "n": m["handled"]["attempts"]}]
    return common.bars(rows, "design", "what", "n")
