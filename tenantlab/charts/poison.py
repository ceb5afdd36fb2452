"""Notebook 03's explorer: the poison finding's knobs over a live timeline."""

from __future__ import annotations

from typing import Any

from .. import nb
from . import timeline


def explorer() -> Any:
    """Return sliders for max attempts and fetches, a backoff switch, and a Run button."""
    return nb.explorer("poison", lambda res: res.table.drop(columns=["label"]),
                       live=lambda: timeline.live("poison: one worker per variant"))
