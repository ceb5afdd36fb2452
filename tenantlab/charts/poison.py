"""Notebook 03's explorer: the poison finding's knobs over a live timeline."""

from __future__ import annotations

from typing import Any

import pandas as pd

from .. import nb
from ..finding import Result
from . import timeline


def explorer() -> Any:
    """Return sliders for max attempts and fetches, a backoff switch, and a Run button."""
    return nb.explorer("poison", lambda res: _table(res),
                       live=lambda: timeline.live("poison: one worker per variant"))


def _table(res: Result) -> pd.DataFrame:
    assert res.table is not None
    return res.table.drop(columns=["label"])
