"""The workers' event log as tables: one row per event, one row per execution.

Pandas only (no charting), so ``reproduce`` and the experiments read event logs without
importing a chart library; ``tenantlab.charts.timeline`` draws these tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

ENDS = {"finish": "done", "fail": "failed", "crash": "crashed", "fenced": "fenced"}
_EVENT_COLS = ["t", "worker", "event", "job", "attempt", "label"]
_SPAN_COLS = ["worker", "job", "attempt", "start", "end", "outcome", "label"]


def frame(events: Iterable[dict[str, Any]], t0: float | None = None) -> pd.DataFrame:
    """Return the events as a table, ``t`` in seconds since t0 (default: the first event)."""
    df = pd.DataFrame(list(events))
    if df.empty:
        return pd.DataFrame(columns=_EVENT_COLS)
    for col in ("job", "attempt"):
        if col not in df:
            df[col] = pd.NA
    df["t"] = df["t"] - (t0 if t0 is not None else df["t"].min())
    df["label"] = [_label(r) for r in df.itertuples()]
    return df.sort_values("t", kind="stable").reset_index(drop=True)


def _label(r: Any) -> str:
    job = "" if pd.isna(r.job) else f" job {int(r.job)}"
    attempt = "" if pd.isna(r.attempt) else f" attempt {int(r.attempt)}"
    return f"{r.event}{job}{attempt}"


def spans(df: pd.DataFrame) -> pd.DataFrame:
    """Return one row per execution: worker, job, attempt, start, end, outcome."""
    rows: list[dict[str, Any]] = []
    open_: dict[tuple[str, Any], dict[str, Any]] = {}
    for r in df.itertuples():
        key = (r.worker, r.job)
        if r.event == "execute":
            open_[key] = {"worker": r.worker, "job": r.job, "attempt": r.attempt,
                          "start": r.t, "end": r.t, "outcome": "running"}
        elif r.event in ENDS and key in open_:
            span = open_.pop(key)
            rows.append({**span, "end": r.t, "outcome": ENDS[r.event]})
    last = df["t"].max() if len(df) else 0.0
    rows += [{**s, "end": last} for s in open_.values()]
    out = pd.DataFrame(rows, columns=_SPAN_COLS[:-1])
    out["label"] = [f"job {int(j)} attempt {int(a)}: {o}" if pd.notna(j) and pd.notna(a) else o
                    for j, a, o in zip(out["job"], out["attempt"], out["outcome"], strict=True)]
    return out


LIMIT = 1500  # marks per chart: a poison job failing thousands of times would swamp the browser


def thin(df: pd.DataFrame, limit: int = LIMIT) -> pd.DataFrame:
    """Keep every rare event, and an even sample of the frequent ones, up to about `limit` rows."""
    if len(df) <= limit:
        return df
    frequent = df["event"].isin(["claim", "fail", "execute", "finish", "idle"])
    rare = df[~frequent]
    keep = max(limit - len(rare), 100)
    step = -(-int(frequent.sum()) // keep)  # ceiling division
    return pd.concat([rare, df[frequent].iloc[::step]]).sort_values("t", kind="stable")
