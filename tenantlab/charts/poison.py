"""Notebook 03's knobs: max attempts, fetches, backoff on/off, and a Run button over a timeline."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..experiments import poison
from . import timeline


def _run(live: Any = None, **knobs: Any) -> pd.DataFrame:
    res = poison.run(live=live, **knobs)
    ok, expected, measured = poison.verdict(res.summary)
    print(("✓ " if ok else "✗ ") + measured)
    return res.table.drop(columns=["label"])


def explorer() -> Any:
    """Return sliders for max attempts and fetches, a backoff switch, and a Run button."""
    import ipywidgets as w

    style = {"description_width": "initial"}
    controls = {
        "max_attempts": w.IntSlider(value=3, min=1, max=6, description="max attempts",
                                    style=style),
        "fetches": w.IntSlider(value=10, min=3, max=20, description="fetches", style=style),
        "backoff": w.Checkbox(value=True, description="backoff (leased)"),
    }
    return timeline.panel(_run, controls, "poison: one worker per variant")
