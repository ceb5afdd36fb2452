"""Charts of notebook 10: the vanished worker's run, live, and the restart's counts.

One lane per thing the server and the workers show, time across (0 = worker A vanishes): A's
backend as the server sees it, the horizon, the job's lease, worker B, the other silent
session that ``idle_in_transaction_session_timeout`` ends, and marks for the claims, the
outside-world calls, the finish and the fenced late finish. Verdicts come from
``vanish.judge`` and ``restart.judge``.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import vanish
from ..experiments._vanish_run import LANES
from ..finding import Result
from . import common, palette

COLOURS = {
    "A's backend: idle in transaction": palette.NAIVE,
    "A's backend: active": "#f58518",
    "A's backend: idle": "#bdbdbd",
    "A's backend: gone": palette.CORRECTED,
    "horizon held by A": "#8b0000",
    "horizon: not A": "#d9d9d9",
    "lease of attempt 1 (A)": "#9ecae9",
    "lease expired": "#ff9da6",
    "lease of attempt 2 (B)": "#4c78a8",
    "job done": palette.CORRECTED,
    "other session: idle in transaction": "#e7969c",
    "other session: gone": "#a1d99b",
    "claim": "#000000",
    "outside-world call": "#f58518",
    "finish": "#4c78a8",
    "late finish fenced": "#9467bd",
    "lease lost": "#ff9da6",
    "A vanishes": "#636363",
    "A is back": palette.CORRECTED,
}
POINTS = ("claim", "finish", "late finish fenced", "lease lost")
RULES = ("A vanishes", "A is back")


def chart(df: pd.DataFrame, title: str = "worker A vanishes at 0 s") -> alt.TopLevelMixin:
    """Return the lanes chart of one run's timeline (``_vanish_run.timeline``)."""
    df = df if len(df) else pd.DataFrame(columns=["lane", "start", "end", "what"])
    end = max(float(df["end"].max()) if len(df) else 0.0, 1.0) + 0.3
    lo = min(float(df["start"].min()) if len(df) else 0.0, 0.0) - 0.2
    x = alt.X("start:Q", title="seconds since worker A vanished",
              scale=alt.Scale(domain=[lo, end], nice=False))
    y = alt.Y("lane:N", sort=list(LANES), title=None, scale=alt.Scale(domain=list(LANES)))
    colour = alt.Color("what:N", title=None,
                       scale=alt.Scale(domain=list(COLOURS), range=list(COLOURS.values())),
                       legend=alt.Legend(orient="bottom", columns=3))
    tip = ["lane:N", "what:N", alt.Tooltip("start:Q", format=".2f", title="at (s)")]
    base = alt.Chart(df)
    def only(*names: str) -> alt.Chart:
        return base.transform_filter(alt.FieldOneOfPredicate(field="what", oneOf=list(names)))

    bars = only(*[w for w in COLOURS if w not in (*POINTS, *RULES, "outside-world call")]
                ).mark_bar(height=16).encode(x=x, x2="end:Q", y=y, color=colour, tooltip=tip)
    marks = only(*POINTS).mark_point(size=120, filled=True, opacity=1).encode(
        x=x, y=y, color=colour, tooltip=tip,
        shape=alt.Shape("what:N", legend=None, scale=alt.Scale(
            domain=list(POINTS), range=["triangle-right", "circle", "cross", "cross"])))
    # Above its lane, so that a finish at the same moment does not hide the call.
    calls = only("outside-world call").mark_point(
        shape="diamond", size=130, filled=True, opacity=1, yOffset=-12).encode(
        x=x, y=y, color=colour, tooltip=tip)
    rules = only(*RULES).mark_rule(strokeDash=[4, 3], size=1.5).encode(
        x=x, color=colour, tooltip=tip)
    return alt.layer(bars, rules, marks, calls).properties(title=title, width=600, height=220)


def live(title: str = "worker A vanishes at 0 s") -> nb.LiveChart:
    """Return a chart that redraws from ``live.update(timeline)`` while the run goes on."""
    return nb.LiveChart(lambda df: chart(df, title),
                        pd.DataFrame(columns=["lane", "start", "end", "what"]))


KEPT = {  # fact -> how the table names it
    "backend_state": "A's backend, as the server sees it",
    "held_locks": "holds its locks",
    "held_xid": "holds its xid",
    "horizon_held": "holds the horizon (the oldest holder)",
    "migration_blocked": "a migration's lock on the table it wrote waits",
    "server_noticed": "the server noticed A was gone",
    "taken_over_after_s": "B took the job over after (s)",
    "owner_completed_after_s": "B completed it after (s)",
    "late_finish_fenced": "A's late finish fenced",
    "outside_executions": "calls the outside world saw",
    "late_call_after_owner_s": "A's outside call, against B's completion",
    "back_after_s": "A back after (s)",
}
RUNS = {"proxy": "network silent (proxy)", "sigstop": "process frozen (SIGSTOP)"}


def kept(res: Result) -> pd.DataFrame:
    """Return what the server kept and what happened, one row per fact, one column per run."""
    assert res.table is not None
    t = res.table.set_index("run")
    return pd.DataFrame({"": list(KEPT.values()), **{
        RUNS[r]: [_when(t.loc[r, f]) if f == "late_call_after_owner_s" else _word(t.loc[r, f])
                  for f in KEPT] for r in t.index}})


def _when(value: Any) -> str:
    if value is None or pd.isna(value):
        return "—"
    return f"{abs(value):.2f} s {'after' if value > 0 else 'before'}"


def _word(value: Any) -> str:
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()  # numpy scalars from the table
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def frozen(res: Result) -> Any:
    """Return the SIGSTOP run's chart (drawn after the run)."""
    r = res.data.get("sigstop")
    df = r["timeline"] if r else pd.DataFrame()
    return chart(df, "worker A frozen (SIGSTOP) at 0 s, continued later")


def noticed(res: Result) -> pd.DataFrame:
    """Return, per setting, when the server (and the worker) noticed, and the defaults' sums."""
    m = res.measured
    dropped = str(m["packets_dropped"]).startswith("measured")
    waited = m.get("tcp_waited_s")

    def text(setting: str, value: float | None, measured_here: bool) -> str:
        if value is not None:
            return f"{value:.2f} s"
        if not measured_here:
            return "not measured here"
        return f"not noticed ({waited:g} s watched)" if waited else "not noticed"

    rows = []
    for setting, s in m["server_noticed_s"].items():
        if setting == "kernel defaults":
            continue
        tcp = setting != vanish.IDLE_TIMEOUT
        client = m["worker_noticed_s"].get(setting)
        server = text(setting, s, dropped or not tcp)
        since = m.get("idle_timeout_after_last_statement_s")
        if not tcp and s is not None and since is not None:
            # This timer starts at the session's last statement, before the cut.
            server = (f"{since:.2f} s after its last statement ({s:.2f} s after the cut, "
                      f"sampled every 0.2 s)")
        rows.append({"setting": setting,
                     "server noticed after": server,
                     "worker noticed after": text(setting, client, dropped)
                     if "client" in setting else ""})
    for what, s in m["default_extrapolated_s"].items():
        rows.append({"setting": f"kernel defaults, {what}",
                     "server noticed after": "unknown" if s is None else
                     f"{s:,.0f} s = {s / 60:,.0f} min (computed, not waited for)",
                     "worker noticed after": ""})
    return pd.DataFrame(rows)


def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart: seconds until the server noticed, per setting."""
    rows = [{"setting": k, "seconds": v} for k, v in m["server_noticed_s"].items()
            if v is not None]
    return alt.Chart(pd.DataFrame(rows, columns=["setting", "seconds"])).mark_bar().encode(
        y=alt.Y("setting:N", title=None), x=alt.X("seconds:Q", title="server noticed after (s)"),
        tooltip=["setting", "seconds"]).properties(width=common.WIDTH, height=90)


def explorer() -> Any:
    """Return sliders for lease, heartbeat, keepalive idle, tcp_user_timeout; Run; the chart."""
    return nb.explorer("vanish", lambda res: nb.table(noticed(res)), live=lambda: live())


def restart_table(res: Result) -> pd.DataFrame:
    """Return the restart run per design: jobs, lost, finished twice, calls and effects."""
    assert res.table is not None
    t = res.table.rename(columns={"effects_with_key": "effects (key deduplicated)",
                                  "side_effects_repeated": "calls repeated",
                                  "jobs_called": "jobs called"})
    return t[["design", "jobs", "done", "lost", "finished_twice", "attempts", "calls",
              "calls repeated", "effects (key deduplicated)"]]
