"""Notebook 04's explorer: the crash finding's knobs over a live timeline."""

from __future__ import annotations

from typing import Any

from .. import nb
from ..finding import Result
from . import timeline


def explorer() -> Any:
    """Return sliders for max attempts (crashes), lease, restart delay and single workers."""
    return nb.explorer("crash", _table, live=lambda: timeline.live("crash: one worker process per row"),
                       per_row=2)


def _table(res: Result) -> Any:
    """Return the run's table, one row per worker process, without the index column."""
    assert res.table is not None  # crash.run always fills it
    return res.table.style.hide(axis="index")
