"""Notebook 13's pieces: the stored matrix as tables, one scenario run live, its timeline.

``stored()`` reads docs/check.json (a real run of ``tenantlab check``) and says when it was
measured; ``run("queue/setting", scenario)`` runs one cell live and returns a ``Live`` (the trial,
the verdict, a one-row table, the witnesses, the timeline chart); ``picker()`` is the dropdown
panel that does the same for the participant's choice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from . import runner
from .adapter import Adapter, Options, rows
from .checks import OVERLAP_NOISE, Result, Trial
from .matrix import LEGEND, applies, columns, marks, star, value
from .scenarios import MEASURED, SCENARIOS

STORED = Path(__file__).resolve().parents[2] / "docs" / "check.json"
OVERLAP = "#000000"
#: The live demonstration: a row whose late finish overwrote its new owner's job in the stored
#: run (a takeover within the freeze), else the kit's own worker, scaled (which fences it out).
DEMOS = ("procrastinate/recommended", "pgqueuer/scaled", "jobqueue/scaled")


def demo() -> str:
    """Return the row notebook 13 runs live: the first of ``DEMOS`` that is installed."""
    have = {value for _, value in available()}
    return next(d for d in DEMOS if d in have)


def load(path: Path = STORED) -> dict[str, Any]:
    return json.loads(path.read_text())


def caption(result: dict[str, Any]) -> str:
    return (f"The stored run: `tenantlab check --runs {result.get('runs', 1)}` on PostgreSQL "
            f"{result['server_version']}, {result.get('date', '?')}, "
            f"{result.get('seconds', '?')} s for the whole matrix.")


def legend(result: dict[str, Any] | None = None) -> str:
    """Return what the rows and the marks mean, and the PgBouncer the run went through."""
    result = result or load()
    text = LEGEND
    if (pb := result.get("pgbouncer")) is not None:
        text += (f"\n\nPgBouncer {pb.get('version')} (pool_mode {pb.get('pool_mode')}, "
                 f"max_prepared_statements {pb.get('max_prepared_statements')}).")
    return text


def stored(result: dict[str, Any] | None = None) -> pd.DataFrame:
    """Return the judged part of the matrix: one row per queue × setting, one column per
    scenario (``measured()`` has the rest)."""
    result = result or load()
    cols = [c for c in columns(result) if c not in MEASURED]
    return pd.DataFrame([{"row": f"{r['queue']} {star(r['setting'])}",
                          **{c: m.get(c, "") for c in cols}} for r, m in marks(result)])


def measured(result: dict[str, Any] | None = None) -> pd.DataFrame:
    """Return the measured columns (wake, throughput) with each row's version."""
    result = result or load()
    cols = [c for c in columns(result) if c in MEASURED]
    return pd.DataFrame([{"row": f"{r['queue']} {star(r['setting'])}",
                          "version": r["version"] or "not installed",
                          **{c: m.get(c, "") for c in cols}} for r, m in marks(result)])


def witnesses(result: dict[str, Any] | None = None) -> pd.DataFrame:
    """Return the evidence under every ✗ (and ?): row, scenario, sentence."""
    result = result or load()
    return pd.DataFrame([{"row": f"{r['queue']} {star(r['setting'])}", "scenario": s, "witness": w}
                         for r in result["rows"] for s, c in r["scenarios"].items()
                         if c["result"] in ("fail", "indeterminate") for w in c["witness"]],
                        columns=["row", "scenario", "witness"])


def promises(result: dict[str, Any] | None = None) -> pd.DataFrame:
    """Return what each row's docs promise."""
    result = result or load()
    return pd.DataFrame([{"row": f"{r['queue']} {star(r['setting'])}", "promises": r["promises"]}
                         for r in result["rows"]])


def settings(result: dict[str, Any] | None = None) -> pd.DataFrame:
    """Return what each row sets, one line per setting."""
    result = result or load()
    return pd.DataFrame([{"row": f"{r['queue']} {star(r['setting'])}", "setting": k,
                          "value": value(v)} for r in result["rows"] for k, v in r["settings"].items()],
                        columns=["row", "setting", "value"])


def available() -> list[tuple[str, str]]:
    """Return the (label, "queue/setting") choices of the installed queues."""
    return [(f"{a.name} {star(a.setting)}", f"{a.name}/{a.setting}") for a in rows()
            if a.version() is not None]


def adapter(choice: str) -> Adapter:
    name, _, setting = choice.partition("/")
    for a in rows([name]):
        if a.setting == (setting or "default"):
            return a
    raise ValueError(f"no queue row {choice!r}; valid: {', '.join(v for _, v in available())}")


@dataclass
class Live:
    """One scenario run live on one row."""

    adapter: Adapter
    scenario: str
    trial: Trial
    result: Result

    def table(self) -> pd.DataFrame:
        r = self.result
        mark = {"pass": "✓", "fail": "✗", "na": "n/a", "indeterminate": "?"}[r.result]
        return pd.DataFrame([{"row": f"{self.adapter.name} {star(self.adapter.setting)}",
                              "scenario": self.scenario, "result": mark,
                              "property": SCENARIOS[self.scenario].property,
                              "executions": len(self.trial.executions),
                              "measured": ", ".join(f"{k}: {v}" for k, v in r.measured.items())}])

    def witness(self) -> pd.DataFrame:
        return pd.DataFrame({"witness": self.result.witness or ["none: the property held"]})

    def chart(self) -> Any:
        return timeline(self.trial)


def run(choice: str, scenario: str, options: Options | None = None) -> Live:
    """Run ``scenario`` once on the row ``choice`` ("queue/setting"); return what it showed."""
    a = adapter(choice)
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; valid: {', '.join(SCENARIOS)}")
    s = SCENARIOS[scenario]
    if (why := applies(a, s)) is not None:
        trial = Trial(scenario, s.bound, 0, 0)
        return Live(a, scenario, trial, Result("na", [why]))
    trial = runner.run(a, s, options=options)
    return Live(a, scenario, trial, s.checker(trial))


def executions(trial: Trial) -> pd.DataFrame:
    """Return one row per execution: job, kind, pid, start and end (seconds since the first
    enqueue; a killed worker's execution ends when it died), outcome."""
    return pd.DataFrame([{"job": f"job {e.job} ({e.kind})", "pid": str(e.pid),
                          "start": round(e.start - trial.t0, 2),
                          "end": round(trial.finish_of(e) - trial.t0, 2),
                          "outcome": e.outcome or "never ended"} for e in trial.executions],
                        columns=["job", "pid", "start", "end", "outcome"])


def overlaps(frame: pd.DataFrame) -> pd.DataFrame:
    """Return the spans where two executions of the same job ran at once."""
    out = []
    rows_ = frame.to_dict("records")
    for i, a in enumerate(rows_):
        for b in rows_[i + 1:]:
            lo, hi = max(a["start"], b["start"]), min(a["end"], b["end"])
            if a["job"] == b["job"] and hi - lo > OVERLAP_NOISE:
                out.append({"job": a["job"], "from": lo, "to": hi,
                            "pids": f"{a['pid']} and {b['pid']}"})
    return pd.DataFrame(out, columns=["job", "from", "to", "pids"])


def timeline(trial: Trial) -> Any:
    """The executions as bars per job (colour: the worker's pid), two at once in black, the
    faults the suite applied as dashed rules."""
    frame = executions(trial)
    bars = alt.Chart(frame).mark_bar(height=12, opacity=0.8).encode(
        y=alt.Y("job:N", title=None),
        x=alt.X("start:Q", title="seconds since the first enqueue"), x2="end:Q",
        color=alt.Color("pid:N", title="worker pid"),
        tooltip=["job", "pid", "start", "end", "outcome"])
    both = alt.Chart(overlaps(frame)).mark_bar(height=4, color=OVERLAP).encode(
        y="job:N", x="from:Q", x2="to:Q",
        tooltip=["job:N", "pids:N", "from:Q", "to:Q"])
    table = alt.Chart(states(trial)).mark_text(dy=-11, fontSize=10, color="#333").encode(
        y="job:N", x="t:Q", text="state:N", tooltip=["job:N", "state:N", "t:Q"])
    faults = pd.DataFrame([{"t": round(f.t - trial.t0, 2), "fault": f"{f.action} {f.pid or ''}"}
                           for f in trial.faults if f.action != "restart-worker"],
                          columns=["t", "fault"])
    rules = alt.Chart(faults).mark_rule(strokeDash=[4, 3], color="#555").encode(
        x="t:Q", tooltip=["fault:N", "t:Q"])
    return alt.layer(bars, both, table, rules).properties(
        width=620, height=alt.Step(34),
        title=f"{trial.scenario}: executions (black: two at once; text: the queue's own state "
              "when it changed; dashed: the suite's faults)")


def states(trial: Trial) -> pd.DataFrame:
    """Return each change of a job's state in the queue's own table, as the suite saw it."""
    out: list[dict[str, Any]] = []
    last: dict[str, str] = {}
    kinds = {j.id: j.kind for j in trial.jobs}
    for t, snapshot in trial.snapshots:
        for job, state in snapshot.items():
            if job in kinds and last.get(job) != state:
                out.append({"job": f"job {job} ({kinds[job]})", "t": round(t - trial.t0, 2),
                            "state": state})
                last[job] = state
    return pd.DataFrame(out, columns=["job", "t", "state"])


def picker(default: str = "", scenario: str = "overrun") -> Any:
    """A dropdown of the installed queue rows and one of the scenarios, and a Run button."""
    import ipywidgets as w
    from IPython.display import display

    from .. import nb

    choices = available()
    queue = w.Dropdown(options=choices, value=default or choices[0][1], description="queue")
    which = w.Dropdown(options=list(SCENARIOS), value=scenario, description="scenario")

    def action() -> None:
        live = run(queue.value, which.value)
        display(nb.table(live.table()), nb.table(live.witness()), live.chart())

    return nb.run_panel([[queue, which]], action)
