"""Notebook 04's knobs: crashes allowed, lease, restart delay, workers; Run over a timeline."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..experiments import crash
from . import timeline


def _run(live: Any = None, **knobs: Any) -> pd.DataFrame:
    res = crash.run(live=live, **knobs)
    ok, expected, measured = crash.verdict(res.summary)
    print(("✓ " if ok else "✗ ") + measured)
    return res.table


def explorer() -> Any:
    """Return sliders for max attempts (crashes), lease, restart delay and single workers."""
    import ipywidgets as w

    style = {"description_width": "initial"}
    controls = {
        "max_attempts": w.IntSlider(value=3, min=1, max=5, description="crashes allowed (max attempts)",
                                    style=style),
        "lease": w.FloatSlider(value=1.0, min=0.5, max=3.0, step=0.1, description="lease (s)",
                               style=style),
        "restart_after": w.FloatSlider(value=1.1, min=0.0, max=3.0, step=0.1,
                                       description="restart after (s)", style=style),
        "single_workers": w.IntSlider(value=4, min=1, max=6, description="single workers",
                                      style=style),
    }
    return timeline.panel(_run, controls, "crash: one worker process per row")
