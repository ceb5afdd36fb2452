"""Read a history file back as executions: who ran which job, when, and how it ended."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Execution:
    """One execution of one job's body. ``end`` None: it never finished (its process died, was
    killed, or is still running); ``outcome`` ``ok`` / ``error`` / None."""

    execution: str
    job: str
    kind: str
    pid: int
    start: float
    attempt: int | None = None
    tenant: Any = None
    seen_tenant: Any = None
    end: float | None = None
    outcome: str | None = None
    error: str | None = None

    def overlaps(self, other: Execution, now: float) -> float:
        """Seconds this execution and ``other`` ran at the same time (0: none)."""
        a_end = self.end if self.end is not None else now
        b_end = other.end if other.end is not None else now
        return max(0.0, min(a_end, b_end) - max(self.start, other.start))


def parse(lines: list[dict[str, Any]]) -> list[Execution]:
    """Pair start and end records into executions, in start order."""
    by_id: dict[str, Execution] = {}
    for r in lines:
        if r.get("event") == "start":
            by_id[r["execution"]] = Execution(
                execution=r["execution"], job=str(r["job"]), kind=r.get("kind", ""),
                pid=int(r["pid"]), start=float(r["t"]), attempt=r.get("attempt"),
                tenant=r.get("tenant"), seen_tenant=r.get("seen_tenant"))
        elif r.get("event") == "end" and r.get("execution") in by_id:
            e = by_id[r["execution"]]
            e.end, e.outcome, e.error = float(r["t"]), r.get("outcome"), r.get("error")
    return sorted(by_id.values(), key=lambda e: e.start)


def read(path: str | Path) -> list[Execution]:
    """Read a history file (missing: no executions); a torn last line is ignored."""
    p = Path(path)
    if not p.exists():
        return []
    lines = []
    for raw in p.read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return parse(lines)


def by_job(executions: list[Execution]) -> dict[str, list[Execution]]:
    """Group executions by job id, each in start order."""
    out: dict[str, list[Execution]] = {}
    for e in executions:
        out.setdefault(e.job, []).append(e)
    return out
