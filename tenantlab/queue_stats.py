"""The operator's ``stats`` in a notebook: jobs per kind and status, the oldest wait, idle kinds.

``frame(conn)`` is ``python -m jobqueue stats`` as a DataFrame (a row per kind and
one for all, a column per status); ``html(conn)`` adds the oldest queued job's age and the
kinds no running worker serves as its caption. Both read ``jobqueue.ops.stats``: one pass over
the jobs, measured live.
"""

from __future__ import annotations

import html as html_lib
from typing import Any

import pandas as pd
import psycopg
from jobqueue import ops


def frame(conn: psycopg.Connection, data: dict[str, Any] | None = None) -> pd.DataFrame:
    """Return jobs per kind (rows, then ``all``) and status (columns)."""
    data = data or ops.stats(conn)
    rows = {kind: [counts.get(s, 0) for s in ops.STATUSES]
            for kind, counts in sorted(data["by_kind"].items())}
    rows["all"] = [data["jobs"].get(s, 0) for s in ops.STATUSES]
    out = pd.DataFrame.from_dict(rows, orient="index", columns=list(ops.STATUSES))
    out.index.name = "kind"
    out.attrs.update(oldest_queued_s=data["oldest_queued_s"],
                     kinds_without_worker=data["kinds_without_worker"],
                     workers=len(data["workers"]))
    return out


def html(conn: psycopg.Connection) -> str:
    """Return the table as HTML with a caption: oldest wait, workers, kinds without a worker."""
    df = frame(conn)
    idle = df.attrs["kinds_without_worker"]
    caption = (f"oldest queued job waiting: {ops.age(df.attrs['oldest_queued_s'])}; "
               f"workers running: {df.attrs['workers']}; kinds queued that no running worker "
               f"serves: {', '.join(idle) if idle else 'none'}")
    return f"<p>{html_lib.escape(caption)}</p>\n{df.to_html()}"
