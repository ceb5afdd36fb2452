"""Charts and widgets of finding ``overrun``: a Gantt chart per run, live, and the slider panel.

One row per worker (both always drawn); the lease window shaded behind each execution,
polling as a thin grey band, executions as bars, the part where two executions run at once in
a warning colour, heartbeats as ticks, and marks for claims, the outside-world call, finishes,
fences, the maximum runtime and lease expiry. ``show(variant)`` runs one variant under a live
chart with its outcome below; ``Explorer`` is the slider panel (its ``run()`` is the Run
button's callback, callable without a browser). Verdicts come from ``overrun.judge``.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Iterator
from typing import Any

import altair as alt
import pandas as pd
from jobqueue import HeartbeatError

from .. import nb
from ..experiments import overrun
from ..experiments._gantt import COLUMNS
from ..finding import Result
from . import common

OK_COLOUR, WARN = "#1b7a2e", "#e45756"
LEGEND = {  # what is drawn -> colour; one legend for every layer, one entry per colour
    "polling": "#d9d9d9",
    "lease window": "#9ecae9",
    "execution: done": "#4c78a8",
    "execution: fenced": "#b279a2",
    "execution: running": "#9d9d9d",
    "two executions at once": WARN,
    "heartbeat": "#54a24b",
    "claim": "#000000",
    "outside-world call": "#f58518",
    "stuck": "#8c6d31",
    "abandon (max runtime)": "#7f3c8d",
    "lease expired": "#8b0000",
    "lease lost": "#ff9da6",
}
# Marks on the bar: kind -> (legend entry, shape). A finish or a fence is drawn in its
# execution's colour. Outside-world calls and lease expiry have layers of their own (above the
# bar, and a tall tick) so that a finish at the same moment does not hide them.
MARKS = {"claim": ("claim", "triangle-right"), "finish": ("execution: done", "circle"),
         "fenced": ("execution: fenced", "cross"), "stuck": ("stuck", "square"),
         "abandon": ("abandon (max runtime)", "triangle-down"),
         "lease-lost": ("lease lost", "cross")}
OWN_LAYER = {"outside": "outside-world call", "expired": "lease expired", "polling": "polling",
             "lease": "lease window", "overlap": "two executions at once",
             "heartbeat": "heartbeat"}


def _color() -> alt.Color:
    return alt.Color("what:N", title=None, scale=alt.Scale(domain=list(LEGEND),
                                                           range=list(LEGEND.values())),
                     legend=alt.Legend(orient="bottom", columns=4))


def chart(segments: pd.DataFrame, title: str = "two workers, one job") -> alt.TopLevelMixin:
    """Return the Gantt chart of one run's segments (``overrun.segments``)."""
    df = segments[COLUMNS] if len(segments) else pd.DataFrame(columns=COLUMNS)
    df = df.assign(what=[_what(k, o) for k, o in zip(df["kind"], df["outcome"], strict=True)])
    order = list(dict.fromkeys([*overrun.WORKERS, *sorted(set(df["worker"]))]))
    end = max(float(df["end"].max()) if len(df) else 0.0, 1.0) + 0.3
    x = alt.X("start:Q", title="seconds since the job was queued",
              scale=alt.Scale(domain=[0, end], nice=False))
    y = alt.Y("worker:N", sort=order, title=None, scale=alt.Scale(domain=order))
    tip = ["worker:N", "label:N", alt.Tooltip("start:Q", format=".2f", title="at (s)")]
    base = alt.Chart(df)

    def kind(*names: str) -> alt.Chart:
        return base.transform_filter(alt.FieldOneOfPredicate(field="kind", oneOf=list(names)))

    polling = kind("polling").mark_bar(height=4).encode(
        x=x, x2="end:Q", y=y, color=_color(), tooltip=tip)
    leases = kind("lease").mark_bar(height=30, opacity=0.45).encode(
        x=x, x2="end:Q", y=y, color=_color(), tooltip=tip)
    execs = kind("execution", "overlap").mark_bar(height=12).encode(
        x=x, x2="end:Q", y=y, color=_color(), tooltip=tip)
    beats = kind("heartbeat").mark_tick(thickness=2, size=26).encode(
        x=x, y=y, color=_color(), tooltip=tip)
    points = kind(*MARKS).mark_point(size=110, filled=True, opacity=1).encode(
        x=x, y=y, color=_color(), tooltip=tip,
        shape=alt.Shape("kind:N", legend=None, scale=alt.Scale(
            domain=list(MARKS), range=[m[1] for m in MARKS.values()])))
    expired = kind("expired").mark_tick(thickness=3, size=34).encode(
        x=x, y=y, color=_color(), tooltip=tip)
    calls = kind("outside").mark_point(
        shape="diamond", size=120, filled=True, opacity=1, yOffset=-17).encode(
        x=x, y=y, color=_color(), tooltip=tip)
    return alt.layer(polling, leases, execs, beats, expired, points, calls).properties(
        title=title, width=600, height=130)


def _what(kind: str, outcome: Any) -> str:
    if kind == "execution":
        return f"execution: {outcome}"
    return OWN_LAYER.get(kind) or MARKS.get(kind, (kind, ""))[0]


def live(title: str) -> nb.LiveChart:
    """Return a Gantt chart that redraws from ``live.update(segments)``."""
    return nb.LiveChart(lambda df: chart(df, title), pd.DataFrame(columns=COLUMNS))


def measured_line(row: Any) -> str:
    """Return what one run showed: executions the world saw vs completions the database kept."""
    calls = ", ".join(row.outside) or "none"
    return (f"the outside world saw {row.executions} execution(s) ({calls}); the database kept "
            f"{row.completions} completion(s) in job_runs; {overrun.describe(row)}")


def _panel(chart_: nb.LiveChart) -> Any:
    """Return (box, note): the chart with a note below it; box is None outside a notebook."""
    import ipywidgets as w

    note = w.HTML(layout=w.Layout(width="auto", max_width="640px"))
    if chart_.widget is None:
        return None, note
    return w.VBox([chart_.widget, note]), note


def show(name: str, **seconds: Any) -> Result:
    """Run one variant under a live chart, its outcome below it; return the run's result.

    ``seconds``: durations other than the article's (lease, job, poll, ...). The verdict over
    all the runs is ``overrun.combine(results).verdict``: one box, not one per run.
    """
    knobs = overrun.Knobs.of(variants=(name,), **seconds)
    v = overrun.variant(name)
    expected, why = overrun.expect(v, knobs)
    chart_ = live(v.label)
    box, note = _panel(chart_)
    note.value = _note(f"expected: {expected or 'too close to call'}", why)
    nb.show(box)
    res = overrun.run(knobs, live=chart_)
    row = next(_rows(res))
    # The outcome in the colour of its check; the verdict box judges all the runs at once.
    note.value = _note(row.verdict, measured_line(row), ok=res.verdict.valid)
    return res


def _rows(res: Result) -> Iterator[Any]:
    """Return the run's table rows, one per variant (``overrun.run`` always fills the table)."""
    assert res.table is not None
    return res.table.itertuples(index=False)


def _note(head: str, body: str, ok: bool | None = None) -> str:
    color = "" if ok is None else f" style='color:{OK_COLOUR if ok else WARN}'"
    return (f"<div style='overflow-wrap:anywhere'><b{color}>{html.escape(head)}</b><br>"
            f"<small>{html.escape(body)}</small></div>")


def _styled(df: pd.DataFrame) -> Any:
    """Return a table that wraps its text instead of growing sideways, without an index."""
    return df.style.hide(axis="index").set_table_styles(
        [{"selector": "td, th", "props": "white-space: normal; text-align: left;"}])


def summary(res: Result) -> Any:
    """Return the runs side by side with the article's numbers: one short row per variant."""
    rows = []
    for r in _rows(res):
        want = overrun.expected_counts(r.variant)
        v = overrun.variant(r.variant) if r.variant in overrun.BY_NAME else None
        rows.append({
            "variant": (v.title if v else r.label),
            "article: executions / completions":
                f"{want['executions']} / {want['completions']}" if want else "—",
            "measured: executions / completions": f"{r.executions} / {r.completions}",
            "heartbeats": int(r.beats), "taken over": "yes" if r.taken_over else "no",
            "fenced": int(r.fenced), "both ran (s)": f"{r.overlap_s:.1f}",
            "outcome": r.verdict,
        })
    return _styled(pd.DataFrame(rows))


SCENARIOS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
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


def expectations(knobs: overrun.Knobs | None = None) -> pd.DataFrame:
    """Return what each slider setting is expected to do (predicted, not measured)."""
    base = knobs or overrun.Knobs()
    rows = []
    for name, switches, change in SCENARIOS:
        v = dataclasses.replace(overrun.variant(name), **switches)
        s = dataclasses.replace(base, **change)
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


def expectations_table(knobs: overrun.Knobs | None = None) -> Any:
    """Return ``expectations()`` as a table whose "why" wraps instead of being cut."""
    return _styled(expectations(knobs))


class Explorer:
    """The slider panel: knobs, switches, a Run button, a live Gantt chart and the verdict.

    The sliders are the finding's knobs (``nb.controls``); the switches make a custom variant.
    Sliders only update the expectation; ``run()`` (the Run button's callback) starts the
    workers. Tests call ``run()`` directly and look at ``live`` and ``result``.
    """

    def __init__(self, knobs: overrun.Knobs | None = None) -> None:
        import ipywidgets as w

        self.sliders = nb.controls(knobs or overrun.Knobs())
        for slider in self.sliders.values():
            slider.continuous_update = False
        self.lease, self.heartbeat = self.sliders["lease"], self.sliders["heartbeat"]
        self.job, self.poll = self.sliders["job"], self.sliders["poll"]
        self.max_runtime, self.hang = self.sliders["max_runtime"], self.sliders["hang"]
        self.fence = w.Checkbox(value=True, description="fenced finish")
        self.use_heartbeat = w.Checkbox(value=True, description="heartbeat")
        self.use_max_runtime = w.Checkbox(value=True, description="maximum runtime")
        self.stuck = w.Checkbox(value=False, description="first attempt gets stuck")
        self.button = w.Button(description="Run", button_style="primary", icon="play")
        self.live = live("your settings")
        self.note = w.HTML(layout=w.Layout(width="auto", max_width="640px"))
        self.result: Result | None = None
        for control in self.controls:
            control.observe(self.expect, names="value")
        self.button.on_click(self.run)
        self.expect()

    @property
    def controls(self) -> list[Any]:
        return [*self.sliders.values(), self.fence, self.use_heartbeat, self.use_max_runtime,
                self.stuck]

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

    def knobs(self) -> overrun.Knobs:
        """Return the knobs the sliders and switches describe (one custom variant)."""
        return overrun.Knobs.of(variants=(self.variant(),),
                                **{name: s.value for name, s in self.sliders.items()})

    def _enable(self) -> None:
        # A switch that is off greys out what it would use: no max runtime without a heartbeat.
        beat = self.use_heartbeat.value
        self.use_max_runtime.disabled = not beat
        self.heartbeat.disabled = not beat
        self.max_runtime.disabled = not (beat and self.use_max_runtime.value)
        self.hang.disabled = not self.stuck.value

    def expect(self, change: Any = None) -> str | None:
        """Show what the current settings should do; no workers run. Return it (None: refused)."""
        self._enable()
        try:
            k = self.knobs()
            v = self.variant()
            v.worker_options(k)
        except (HeartbeatError, overrun.OverrunError) as e:
            self.note.value = _note("refused", str(e), ok=False)
            self.button.disabled = True
            return None
        self.button.disabled = False
        expected, why = overrun.expect(v, k)
        self.note.value = _note(f"expected: {expected or 'too close to call'}", why)
        return expected or "too close to call"

    def run(self, button: Any = None) -> Result | None:
        """Run the current settings with two workers, redrawing the chart; show the verdict."""
        if self.expect() is None:
            return None
        k, v = self.knobs(), self.variant()
        self.button.disabled = True
        self.live.make = lambda df: chart(df, v.label)
        try:
            self.result = overrun.run(k, live=self.live)
        finally:
            self.button.disabled = False
        row = next(_rows(self.result))
        self.note.value = _note(self.result.verdict.headline() + f": {row.verdict}",
                                measured_line(row), ok=self.result.verdict.valid)
        return self.result

    @property
    def widget(self) -> Any:
        import ipywidgets as w

        knobs = w.VBox(list(self.sliders.values()))
        switches = w.VBox([self.fence, self.use_heartbeat, self.use_max_runtime, self.stuck,
                           self.button])
        shown = self.live.widget if self.live.widget is not None else w.Output()
        return w.VBox([w.HBox([knobs, switches]), shown, self.note])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart of what `reproduce` measured."""
    rows = [{"variant": v, "what": what, "n": n}
            for what in ("executions", "completions") for v, n in m[what].items()]
    return common.bars(rows, "variant", "what", "n")
