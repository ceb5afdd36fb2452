"""Notebook 04's explorer: the crash finding's knobs over a live timeline."""

from __future__ import annotations

from typing import Any

from .. import nb
from . import timeline


def explorer() -> Any:
    """Return sliders for max attempts (crashes), lease, restart delay and single workers."""
    return nb.explorer("crash", lambda res: res.table.style.hide(axis="index"),
                       live=lambda: timeline.live("crash: one worker process per row"),
                       per_row=2)
