"""Charts and widgets of finding ``overrun``: a Gantt chart per run, live, and the slider panel.

One row per worker; the lease window shaded behind each execution, executions as bars, the
part where two executions run at once in a warning colour, heartbeats as ticks, and marks for
claims, the outside-world call, finishes, fences, the maximum runtime and lease expiry.
``show(variant)`` runs one variant under a live chart with the verdict beside it; ``Explorer``
is the slider panel (its ``run()`` is the Run button's callback, callable without a browser).
"""

from __future__ import annotations

import html
from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import overrun
from ..heartbeat import HeartbeatError

WARN = "#e45756"
LEGEND = {  # what is drawn -> colour; one legend for every layer
    "lease window": "#9ecae9",
    "execution: done": "#4c78a8",
    "execution: fenced": "#b279a2",
    "execution: running": "#9d9d9d",
    "two executions at once": WARN,
    "heartbeat": "#54a24b",
    "claim": "#000000",
    "outside-world call": "#f58518",
    "finish": "#4c78a8",
    "fenced": "#b279a2",
    "stuck": "#8c6d31",
    "abandon (max runtime)": "#7f3c8d",
    "lease expired": "#8b0000",
    "lease lost": "#bab0ac",
}
# Marks on the bar: kind -> (legend entry, shape). Outside-world calls and lease expiry have
# layers of their own (above the bar, and a tall tick) so that a finish at the same moment
# does not hide them.
MARKS = {"claim": ("claim", "triangle-right"), "finish": ("finish", "circle"),
         "fenced": ("fenced", "cross"), "stuck": ("stuck", "square"),
         "abandon": ("abandon (max runtime)", "triangle-down"), "lease-lost": ("lease lost", "cross")}
OWN_LAYER = {"outside": "outside-world call", "expired": "lease expired"}


def _color() -> alt.Color:
    return alt.Color("what:N", title=None, scale=alt.Scale(domain=list(LEGEND),
                                                           range=list(LEGEND.values())),
                     legend=alt.Legend(orient="bottom", columns=4))


def chart(segments: pd.DataFrame, title: str = "two workers, one job") -> alt.TopLevelMixin:
    """Return the Gantt chart of one run's segments (``overrun.segments``)."""
    df = segments if len(segments) else pd.DataFrame(columns=overrun.SEGMENT_COLUMNS)
    df = df.assign(what=[_what(k, o) for k, o in zip(df["kind"], df["outcome"], strict=True)])
    order = sorted(set(df["worker"])) or list(overrun.WORKERS)
    end = max(float(df["end"].max()) if len(df) else 0.0, 1.0) + 0.3
    x = alt.X("start:Q", title="seconds since the job was queued",
              scale=alt.Scale(domain=[0, end], nice=False))
    y = alt.Y("worker:N", sort=order, title=None)
    tip = ["worker:N", "label:N", alt.Tooltip("start:Q", format=".2f", title="at (s)")]
    base = alt.Chart(df)
    leases = base.transform_filter("datum.kind == 'lease'").mark_bar(
        height=30, opacity=0.45).encode(x=x, x2="end:Q", y=y, color=_color(), tooltip=tip)
    execs = base.transform_filter("datum.kind == 'execution'").mark_bar(height=12).encode(
        x=x, x2="end:Q", y=y, color=_color(), tooltip=tip)
    overlap = base.transform_filter("datum.kind == 'overlap'").mark_bar(height=12).encode(
        x=x, x2="end:Q", y=y, color=_color(), tooltip=tip)
    beats = base.transform_filter("datum.kind == 'heartbeat'").mark_tick(
        thickness=2, size=26).encode(x=x, y=y, color=_color(), tooltip=tip)
    points = base.transform_filter(alt.FieldOneOfPredicate(field="kind", oneOf=list(MARKS))).mark_point(
        size=110, filled=True, opacity=1).encode(
        x=x, y=y, color=_color(), tooltip=tip,
        shape=alt.Shape("what:N", legend=None, scale=alt.Scale(
            domain=[m[0] for m in MARKS.values()], range=[m[1] for m in MARKS.values()])))
    expired = base.transform_filter("datum.kind == 'expired'").mark_tick(
        thickness=3, size=34).encode(x=x, y=y, color=_color(), tooltip=tip)
    calls = base.transform_filter("datum.kind == 'outside'").mark_point(
        shape="diamond", size=120, filled=True, opacity=1, yOffset=-17).encode(
        x=x, y=y, color=_color(), tooltip=tip)
    return alt.layer(leases, execs, overlap, beats, expired, points, calls).properties(
        title=title, width=620, height=130)


def _what(kind: str, outcome: Any) -> str:
    if kind == "lease":
        return "lease window"
    if kind == "execution":
        return f"execution: {outcome}"
    if kind == "overlap":
        return "two executions at once"
    if kind == "heartbeat":
        return "heartbeat"
    return OWN_LAYER.get(kind) or MARKS.get(kind, (kind, ""))[0]


def live(title: str) -> nb.LiveChart:
    """Return a Gantt chart that redraws from ``live.update(segments)``."""
    return nb.LiveChart(lambda df: chart(df, title),
                        pd.DataFrame(columns=overrun.SEGMENT_COLUMNS))


def measured_line(row: Any) -> str:
    """Return what one run showed: executions the world saw vs completions the database kept."""
    calls = ", ".join(row.outside) or "none"
    return (f"the outside world saw {row.executions} execution(s) ({calls}); the database kept "
            f"{row.completions} completion(s) in job_runs; {overrun.describe(row)}")


def judge(row: Any, article: bool = True) -> tuple[bool, str]:
    """Return (as expected, the verdict line) for one run.

    ``article``: the run used the article's settings, so its counts are judged against the
    article's; otherwise against what ``overrun.expect`` predicted for the settings used.
    """
    want = overrun.expected_counts(row.variant) if article else None
    if want is not None:
        ok = overrun.check(pd.DataFrame([row._asdict()]))[row.variant]
        expected = overrun.verdict_of(want["executions"], want["completions"])
    else:
        ok = bool(row.as_expected)
        expected = row.expected or "too close to call"
    return ok, nb.verdict(ok, expected, row.verdict)


def _panel(chart_: nb.LiveChart) -> Any:
    """Return (box, html) with the verdict beside the chart; box is None outside a notebook."""
    import ipywidgets as w

    note = w.HTML(layout=w.Layout(width="300px", margin="0 0 0 16px"))
    if chart_.widget is None:
        return None, note
    return w.HBox([chart_.widget, note]), note


def show(name: str, **settings: float) -> pd.DataFrame:
    """Run one variant under a live chart, the verdict beside it; return its row of numbers."""
    v = overrun.variant(name)
    s = overrun.Settings(**settings)
    expected, why = overrun.expect(v, s)
    chart_ = live(v.label)
    box, note = _panel(chart_)
    note.value = _note(f"expected: {expected or 'too close to call'}", why)
    nb.show(box)
    res = overrun.run(variants=(v,), live=chart_, settings=s)
    row = next(res.table.itertuples(index=False))
    ok, line = judge(row, article=s == overrun.Settings())
    note.value = _note(line, measured_line(row), ok=ok)
    print(line)
    print(measured_line(row))
    return res.table[["variant", "executions", "completions", "db_runs", "beats", "abandoned",
                      "taken_over", "fenced", "overlap_s", "verdict"]].set_index("variant")


def _note(head: str, body: str, ok: bool | None = None) -> str:
    color = "" if ok is None else f" style='color:{'#2ca02c' if ok else WARN}'"
    return f"<b{color}>{html.escape(head)}</b><br><small>{html.escape(body)}</small>"


def summary(rows: list[pd.DataFrame]) -> pd.DataFrame:
    """Return the runs side by side with the article's numbers."""
    df = pd.concat(rows)
    want = {v: overrun.expected_counts(v) or {} for v in df.index}
    df.insert(1, "article executions", [want[v].get("executions") for v in df.index])
    df.insert(3, "article completions", [want[v].get("completions") for v in df.index])
    return df


SCENARIOS: list[tuple[str, dict[str, Any], dict[str, float]]] = [
    ("lease_only", {}, {}),
    ("lease_only", {}, {"job": 1.0}),
    ("lease_only", {}, {"poll": 1.0}),
    ("fence", {}, {}),
    ("heartbeat", {}, {}),
    ("heartbeat", {}, {"heartbeat": 2.5}),
    ("stuck", {}, {}),
    ("max_runtime", {}, {}),
    ("max_runtime", {"fence": False}, {}),
    ("max_runtime", {}, {"max_runtime": 9.0}),
]


def expectations(settings: overrun.Settings | None = None) -> pd.DataFrame:
    """Return what each slider setting is expected to do (predicted, not measured)."""
    base = settings or overrun.Settings()
    rows = []
    for name, switches, change in SCENARIOS:
        v = overrun.variant(name)
        v = overrun.Variant(**{**v.__dict__, **switches})
        s = overrun.Settings(**{**base.__dict__, **change})
        try:
            v.worker_options(s)
            expected, why = overrun.expect(v, s)
        except HeartbeatError as e:
            expected, why = "refused", str(e)
        rows.append({
            "fence": "yes" if v.fence else "no",
            "heartbeat": f"{s.heartbeat:g} s" if v.heartbeat else "off",
            "max runtime": f"{s.max_runtime:g} s" if v.max_runtime else "off",
            "lease": f"{s.lease:g} s", "job": f"{s.job:g} s" + (f" + stuck {s.hang:g} s"
                                                                 if v.stuck else ""),
            "poll": f"{s.poll:g} s", "expected": expected or "too close to call", "why": why,
        })
    return pd.DataFrame(rows)


class Explorer:
    """The slider panel: knobs, switches, a Run button, a live Gantt chart and the verdict.

    Sliders only update the expectation; ``run()`` (the Run button's callback) starts the
    workers. Tests call ``run()`` directly and look at ``live`` and ``result``.
    """

    def __init__(self, settings: overrun.Settings | None = None) -> None:
        import ipywidgets as w

        s = settings or overrun.Settings()
        style = {"description_width": "120px"}

        def slider(value: float, lo: float, hi: float, step: float, text: str) -> Any:
            return w.FloatSlider(value=value, min=lo, max=hi, step=step, description=text,
                                 style=style, continuous_update=False, readout_format=".2g")

        self.lease = slider(s.lease, 0.5, 6, 0.25, "lease (s)")
        self.heartbeat = slider(s.heartbeat, 0.1, 4, 0.1, "heartbeat every (s)")
        self.job = slider(s.job, 0.5, 8, 0.25, "job duration (s)")
        self.poll = slider(s.poll, 0.05, 2, 0.05, "poll every (s)")
        self.max_runtime = slider(s.max_runtime, 1, 12, 0.5, "max runtime (s)")
        self.hang = slider(s.hang, 0.5, 10, 0.5, "stuck for (s)")
        self.fence = w.Checkbox(value=True, description="fenced finish")
        self.use_heartbeat = w.Checkbox(value=True, description="heartbeat")
        self.use_max_runtime = w.Checkbox(value=True, description="maximum runtime")
        self.stuck = w.Checkbox(value=False, description="first attempt gets stuck")
        self.button = w.Button(description="Run", button_style="primary", icon="play")
        self.live = live("your settings")
        self.note = w.HTML(layout=w.Layout(width="300px", margin="0 0 0 16px"))
        self.result: overrun.Result | None = None
        for control in self.controls:
            control.observe(self.expect, names="value")
        self.button.on_click(self.run)
        self.expect()

    @property
    def controls(self) -> list[Any]:
        return [self.lease, self.heartbeat, self.job, self.poll, self.max_runtime, self.hang,
                self.fence, self.use_heartbeat, self.use_max_runtime, self.stuck]

    def variant(self) -> overrun.Variant:
        """Return the variant the switches describe."""
        parts = ["fence" if self.fence.value else "no fence"]
        if self.use_heartbeat.value:
            parts.append(f"heartbeat {self.heartbeat.value:g} s")
            if self.use_max_runtime.value:
                parts.append(f"max runtime {self.max_runtime.value:g} s")
        if self.stuck.value:
            parts.append(f"stuck {self.hang.value:g} s")
        return overrun.Variant(
            "custom", ", ".join(parts), fence=self.fence.value,
            heartbeat=self.use_heartbeat.value,
            max_runtime=self.use_heartbeat.value and self.use_max_runtime.value,
            stuck=self.stuck.value)

    def settings(self) -> dict[str, float]:
        return {"lease": self.lease.value, "heartbeat": self.heartbeat.value,
                "job": self.job.value, "poll": self.poll.value,
                "max_runtime": self.max_runtime.value, "hang": self.hang.value}

    def expect(self, change: Any = None) -> str | None:
        """Show what the current settings should do; no workers run. Return it (None: refused)."""
        v = self.variant()
        try:
            s = overrun.Settings(**self.settings())
            v.worker_options(s)
        except (HeartbeatError, overrun.OverrunError) as e:
            self.note.value = _note("refused", str(e), ok=False)
            self.button.disabled = True
            return None
        self.button.disabled = False
        expected, why = overrun.expect(v, s)
        self.note.value = _note(f"expected: {expected or 'too close to call'}", why)
        return expected or "too close to call"

    def run(self, button: Any = None) -> overrun.Result | None:
        """Run the current settings with two workers, redrawing the chart; show the verdict."""
        if self.expect() is None:
            return None
        v = self.variant()
        self.button.disabled = True
        self.live.make = lambda df: chart(df, v.label)
        try:
            self.result = overrun.run(variants=(v,), live=self.live,
                                      settings=overrun.Settings(**self.settings()))
        finally:
            self.button.disabled = False
        row = next(self.result.table.itertuples(index=False))
        ok, line = judge(row, article=False)
        self.note.value = _note(line, measured_line(row), ok=ok)
        return self.result

    @property
    def widget(self) -> Any:
        import ipywidgets as w

        knobs = w.VBox([self.lease, self.heartbeat, self.job, self.poll, self.max_runtime,
                        self.hang])
        switches = w.VBox([self.fence, self.use_heartbeat, self.use_max_runtime, self.stuck,
                           self.button])
        shown = self.live.widget if self.live.widget is not None else w.Output()
        return w.VBox([w.HBox([knobs, switches]), w.HBox([shown, self.note])])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
