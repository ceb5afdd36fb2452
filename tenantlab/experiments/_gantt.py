"""The Gantt rows of finding ``overrun``: who held the lease, who ran, when two ran at once.

Built from the workers' event log (plain dicts, times in epoch seconds) with pandas only, so the
experiment can redraw its live chart and ``reproduce`` need not import a chart library;
``tenantlab.charts.overrun`` draws them.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

COLUMNS = ["kind", "worker", "attempt", "start", "end", "outcome", "label"]
ENDS = ("finish", "fenced", "fail", "crash")  # events that end an execution


def segments(ev: list[dict[str, Any]], *, t0: float, now: float) -> pd.DataFrame:
    """Return the Gantt rows of one run: polling, lease windows, executions, overlaps and marks.

    One row per thing drawn: ``kind`` (polling, lease, execution, overlap, or a mark: claim,
    heartbeat, stuck, abandon, expired, lease-lost, outside, finish, fenced), ``worker``,
    ``attempt``, ``start`` and ``end`` in seconds since ``t0`` (the job was queued), ``outcome``
    of an execution (done, fenced, running) and a ``label``. Whatever still runs ends at ``now``.
    """
    lease = {e["worker"]: e.get("lease") for e in ev if e["event"] == "worker-start"}
    rows: list[dict[str, Any]] = []
    execs: dict[tuple[str, Any], dict[str, Any]] = {}
    until: dict[tuple[str, Any], float] = {}
    claimed: dict[tuple[str, Any], float] = {}
    polling: dict[str, float] = {}

    def row(kind: str, worker: str, attempt: Any, start: float, end: float, label: str,
            outcome: str | None = None) -> None:
        rows.append({"kind": kind, "worker": worker, "attempt": attempt, "start": start - t0,
                     "end": end - t0, "outcome": outcome, "label": label})

    def mark(e: dict[str, Any], kind: str, label: str) -> None:
        row(kind, e["worker"], e.get("attempt"), e["t"], e["t"], label)

    def stop_polling(worker: str, t: float) -> None:
        # A worker polls from its first empty poll (often before the job was queued) on.
        if worker in polling:
            row("polling", worker, None, max(polling.pop(worker), t0), max(t, t0),
                "polling: nothing it may claim")

    for e in ev:
        key = (e["worker"], e.get("attempt"))
        kind = e["event"]
        if kind == "idle":
            polling.setdefault(e["worker"], e["t"])
        elif kind == "worker-stop":
            stop_polling(e["worker"], e["t"])
        elif kind == "claim":
            stop_polling(e["worker"], e["t"])
            claimed[key] = e["t"]
            mark(e, "claim", f"claims attempt {e['attempt']}")
        elif kind == "execute":
            execs[key] = {"start": e["t"], "end": None, "outcome": "running"}
        elif kind == "heartbeat":
            until[key] = max(until.get(key, 0.0), e["until"])
            mark(e, "heartbeat", f"heartbeat: lease until +{e['until'] - t0:.1f} s")
        elif kind in ("finish", "fenced") and key in execs:
            execs[key].update(end=e["t"], outcome="done" if kind == "finish" else "fenced")
            mark(e, kind, "finished: its write committed" if kind == "finish"
                 else "fenced: its finish hit no row, rolled back")
        elif kind == "outside":
            mark(e, "outside", "called the outside world (cannot be rolled back)")
        elif kind == "stuck":
            mark(e, "stuck", f"stuck: the call hangs {e['seconds']:g} s")
        elif kind == "abandon":
            mark(e, "abandon", f"maximum runtime ({e['max_runtime']:g} s): heartbeat stops")
        elif kind == "lease-lost":
            mark(e, "lease-lost", "heartbeat: lease lost to another attempt")
    for worker in list(polling):
        stop_polling(worker, now)
    spans = []
    for (worker, attempt), x in execs.items():
        end = x["end"] if x["end"] is not None else now
        spans.append((worker, attempt, x["start"], end))
        row("execution", worker, attempt, x["start"], end, f"attempt {attempt}: {x['outcome']}",
            x["outcome"])
        start, length = claimed.get((worker, attempt), x["start"]), lease.get(worker) or 0.0
        expires = max(start + length, until.get((worker, attempt), 0.0))
        held = min(expires, end) if x["outcome"] == "done" else expires  # done releases it
        row("lease", worker, attempt, start, held, f"lease of attempt {attempt}")
        if expires < end:
            row("expired", worker, attempt, expires, expires,
                f"lease of attempt {attempt} expired while it ran")
    for i, (w1, a1, s1, e1) in enumerate(spans):
        for w2, a2, s2, e2 in spans[i + 1:]:
            lo, hi = max(s1, s2), min(e1, e2)
            if hi > lo:
                for w, a in ((w1, a1), (w2, a2)):
                    row("overlap", w, a, lo, hi, f"two executions at once for {hi - lo:.1f} s")
    return pd.DataFrame(rows, columns=COLUMNS)


def overlap_seconds(ev: list[dict[str, Any]]) -> float:
    """Return the seconds during which two executions ran at once."""
    spans, start = [], {}
    for e in ev:
        if e["event"] == "execute":
            start[e["worker"]] = e["t"]
        elif e["event"] in ENDS and e["worker"] in start:
            spans.append((start.pop(e["worker"]), e["t"]))
    total = 0.0
    for i, (a0, a1) in enumerate(spans):
        for b0, b1 in spans[i + 1:]:
            total += max(0.0, min(a1, b1) - max(a0, b0))
    return total
