"""Chart of finding ``restart`` for the report page (notebook 10 draws its tables)."""

from __future__ import annotations

from typing import Any

import altair as alt

from . import common


def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart: jobs, calls made and effects, lost and twice."""
    if "skipped" in m:
        raise ValueError(m["skipped"])
    rows = [{"queue": "production", "what": "jobs", "n": m["jobs"]},
            {"queue": "production", "what": "calls made", "n": m["calls_made"]},
            {"queue": "production", "what": "effects (idempotency key)",
             "n": m["effects_with_idempotency_key"]},
            {"queue": "production", "what": "lost", "n": m["lost"]},
            {"queue": "production", "what": "finished twice", "n": m["finished_twice"]}]
    return common.bars(rows, "queue", "what", "n")
