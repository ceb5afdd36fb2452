"""Draw the workers' event log as a timeline: one row per worker process, time across.

Executions are bars (from ``execute`` to its finish, failure, crash or fence), the other events
are marks on them: claims, failures, crashes, fences, dead jobs, reaps. ``live()`` returns a
chart that redraws while the workers run; ``panel()`` puts knobs and a Run button above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..eventtable import _EVENT_COLS, ENDS, LIMIT, frame, spans, thin  # noqa: F401 (re-exported)
from . import palette

__all__ = ["frame", "spans", "thin", "chart", "live", "panel", "lifetimes"]

MARKS = ["claim", "finish", "fail", "crash", "fenced", "dead", "reap", "idle"]
#: A mark is named like the bar it ends, so one word (and one colour) per legend entry.
MARK_WORDS = {**ENDS, "claim": "claim", "dead": "dead", "reap": "reaped", "idle": "queue empty"}
COLORS = palette.EVENTS


def chart(df: pd.DataFrame, title: str = "workers over time") -> alt.LayerChart:
    """Return the timeline of an events table made by ``frame`` (thinned past LIMIT events).

    Every worker process gets a row from its start to its stop (a worker that found nothing to
    do is a row too); executions are bars, events marks, one legend entry per colour; at the
    right of each row, how many claims and failures it made (ten claims within a millisecond
    would otherwise be one dot).
    """
    if len(df) > LIMIT:
        title = f"{title} (every {-(-len(df) // LIMIT)}th frequent event shown)"
    df = df if len(df) else pd.DataFrame(columns=_EVENT_COLS)
    runs = spans(df)  # from every event: thinning must not split an execution from its end
    runs = runs.iloc[::-(-len(runs) // LIMIT)] if len(runs) > LIMIT else runs
    alive = lifetimes(df)
    counts = _counts(df)
    df = thin(df)
    order = list(dict.fromkeys([*alive["worker"], *df["worker"]])) if len(df) else []
    y = alt.Y("worker:N", sort=order, title=None)
    points = df.loc[df["event"].isin(MARKS), ["t", "worker", "event", "label"]] if len(df) else \
        pd.DataFrame(columns=["t", "worker", "event", "label"])
    points = points.assign(kind=points["event"].map(MARK_WORDS)).drop(columns=["event"])
    shown = [k for k in COLORS if k in set(runs["outcome"]) | set(points["kind"])]
    color = alt.Color("kind:N", title=None, legend=alt.Legend(orient="bottom", columns=6),
                      scale=alt.Scale(domain=shown or ["claim"],
                                      range=[COLORS[k] for k in shown or ["claim"]]))
    life = alt.Chart(alive).mark_rule(strokeWidth=2, color=COLORS["alive"]).encode(
        x=alt.X("start:Q", title="seconds"), x2="end:Q", y=y,
        tooltip=["worker:N", "label:N"])
    bars = alt.Chart(runs[["worker", "start", "end", "outcome", "label"]].rename(
        columns={"outcome": "kind"})).mark_bar(
        height=14, opacity=0.6).encode(
        x=alt.X("start:Q", title="seconds"), x2="end:Q", y=y, color=color,
        tooltip=["worker:N", "label:N"])
    # Only the columns drawn: other event fields (errors, results) hold NaN, which the widget's
    # JSON cannot carry.
    marks = alt.Chart(points).mark_point(size=90, filled=True).encode(
        x="t:Q", y=y, color=color,
        shape=alt.Shape("kind:N", title=None, legend=None),
        tooltip=["worker:N", "label:N", alt.Tooltip("t:Q", format=".2f")])
    text = alt.Chart(counts).mark_text(align="left", dx=6, fontSize=11, color="#333").encode(
        x=alt.value(560), y=y, text="text:N")
    return (life + bars + marks + text).properties(
        title=title, width=560, height=max(80, 26 * max(len(order), 1)))


def lifetimes(df: pd.DataFrame) -> pd.DataFrame:
    """Return each worker's life: from its first to its last event, with why it stopped."""
    if not len(df):
        return pd.DataFrame(columns=["worker", "start", "end", "label"])
    g = df.groupby("worker", sort=False)["t"]
    out = pd.DataFrame({"start": g.min(), "end": g.max()}).reset_index()
    stops = df[df["event"] == "worker-stop"].set_index("worker")
    out["label"] = [
        f"{w}: claimed {int(stops.loc[w, 'claimed'])} jobs, then stopped"
        if w in stops.index and "claimed" in stops and pd.notna(stops.loc[w, "claimed"])
        else f"{w}: alive" for w in out["worker"]]
    return out


def _counts(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for w, d in df.groupby("worker", sort=False) if len(df) else []:
        ev = d["event"].value_counts()
        parts = [f"{int(ev.get(e, 0))} {word}" for e, word in
                 (("claim", "claims"), ("fail", "failed"), ("crash", "crashed"),
                  ("fenced", "fenced")) if ev.get(e, 0)]
        rows.append({"worker": w, "text": ", ".join(parts) or "claimed nothing"})
    return pd.DataFrame(rows, columns=["worker", "text"])


def live(title: str = "workers over time") -> nb.LiveChart:
    """Return a timeline that redraws from ``live.update(frame(...))`` while workers run."""
    return nb.LiveChart(lambda df: chart(df, title), frame([]))


def panel(run: Callable[..., Any], controls: dict[str, Any], title: str) -> Any:
    """Return knobs, a Run button and a live timeline; the button calls ``run(live=, **knobs)``.

    Sliders only set values: nothing runs until the button is pressed.
    """
    from IPython.display import display

    def action() -> None:
        chart_ = live(title)
        display(chart_)
        display(run(live=chart_, **{k: c.value for k, c in controls.items()}))

    return nb.run_panel([list(controls.values())], action)
