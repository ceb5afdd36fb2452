"""Run the findings' experiments and judge each against the article's claim.

``run(repeat=N)`` runs every finding N times: the JSON then says in how many runs it
reproduced (``runs``, ``reproduced_runs``), gives every measured number as a range over the
runs (``ranges``), and states each check's measured text with its numbers as ranges. A stored
file can be judged again offline (:func:`rejudge`), as Jepsen re-checks a stored history.
"""

from __future__ import annotations

import json
import math
import platform
import re
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from . import db, settings
from .experiments import REGISTRY, get
from .finding import NOT_OK, OK, plain

#: At most this many runs of every finding in one reproduce (a full --repeat 20 is hours).
MAX_REPEAT = 20


def run(ids: list[str] | None = None, full: bool | None = None, echo: bool = True,
        repeat: int = 1, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the given findings (all when empty) `repeat` times; return the JSON document.

    ``full``: the article's sizes; None reads TENANTLAB_SIZE (workshop unless it says full).
    """
    if not 1 <= repeat <= MAX_REPEAT:
        raise ValueError(f"repeat must be from 1 to {MAX_REPEAT}, not {repeat}")
    if full is None:
        full = settings.size() == "full"
    entries = [get(finding) for finding in (ids or REGISTRY)]  # unknown ids fail before a run
    result: dict[str, Any] = {
        "server_version": db.server_version(),
        "full": full,
        "repeat": repeat,
        "python": platform.python_version(),
        "packages": _versions(),
        "findings": {},
    }
    for entry in entries:
        runs: list[dict[str, Any]] = []
        for n in range(1, repeat + 1):
            if echo:
                of = f" (run {n} of {repeat})" if repeat > 1 else ""
                print(f"{entry.id}: running{of} ...", file=sys.stderr, flush=True)
            started = time.perf_counter()
            res = entry.run(full=full)
            runs.append({
                "reproduced": res.verdict.valid,
                "measured": plain(res.measured),
                "verdict": res.verdict.to_json(),
                "knobs": plain(res.knobs.as_dict()),
                "seconds": round(time.perf_counter() - started, 2),
            })
            if echo and repeat > 1:
                print(f"{entry.id}: run {n} of {repeat}: "
                      f"{'reproduced' if res.verdict.valid else 'NOT reproduced'} "
                      f"({runs[-1]['seconds']:.1f} s)", file=sys.stderr, flush=True)
        result["findings"][entry.id] = combine(entry.claim, entry.article, runs)
    return result


def combine(claim: str, article: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return one finding's entry from its runs: k of N, ranges, and the checks over the runs.

    The keys of a single run are kept (``measured`` and ``knobs`` are the last run's, a real
    reading); ``verdict`` is the verdict over all runs: a check holds when it held in every
    run, and its measured text states each number as the range over the runs.
    """
    last = runs[-1]
    verdict = merge_verdicts([r["verdict"] for r in runs])
    return {
        "claim": claim,
        "reproduced": all(r["reproduced"] for r in runs),
        "runs": len(runs),
        "reproduced_runs": sum(r["reproduced"] for r in runs),
        "measured": last["measured"],
        "ranges": ranges([r["measured"] for r in runs]),
        "summary": summary(verdict),
        "article": article,
        "seconds": round(sum(r["seconds"] for r in runs), 2),
        "seconds_per_run": [r["seconds"] for r in runs],
        "verdict": verdict,
        "knobs": last["knobs"],
        "per_run": [{"reproduced": r["reproduced"], "verdict": r["verdict"],
                     "measured": r["measured"], "seconds": r["seconds"]} for r in runs],
    }


def merge_verdicts(verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the verdict over several runs: each check with ok_runs, and measured as ranges."""
    names: list[str] = []
    for v in verdicts:
        names += [n for n in v["checks"] if n not in names]
    checks = {}
    for name in names:
        seen = [v["checks"][name] for v in verdicts if name in v["checks"]]
        ok_runs = sum(bool(c["ok"]) for c in seen)
        checks[name] = {
            "ok": ok_runs == len(verdicts),
            "expected": seen[0]["expected"],
            "measured": merge_texts([c["measured"] for c in seen]),
            "timing": any(c.get("timing", False) for c in seen),
            "ok_runs": ok_runs,
            "runs": len(verdicts),
        }
    return {"valid": bool(checks) and all(v["valid"] for v in verdicts),
            "against": verdicts[-1]["against"], "checks": checks,
            "valid_runs": sum(bool(v["valid"]) for v in verdicts), "runs": len(verdicts)}


def summary(verdict: dict[str, Any]) -> str:
    """Return the verdict's own line: each check's mark and measured text (k of N when mixed)."""
    parts = []
    for name, c in verdict["checks"].items():
        mark = OK if c["ok"] else NOT_OK
        runs = c.get("runs", 1)
        tally = f" ({c['ok_runs']} of {runs} runs)" if runs > 1 and not c["ok"] else ""
        parts.append(f"{mark} {name}: {c['measured']}{tally}")
    return "; ".join(parts)


_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")


def merge_texts(texts: list[str]) -> str:
    """Return one text for the same measured text of several runs, numbers as ranges.

    "1.2× (0.4 vs 0.3 ms)" and "1.5× (0.45 vs 0.3 ms)" give "1.2–1.5× (0.4–0.45 vs 0.3 ms)";
    texts that differ in more than their numbers are listed, each once, in order.
    """
    distinct = list(dict.fromkeys(texts))
    if len(distinct) == 1:
        return distinct[0]
    shapes = {_NUMBER.sub("\0", t) for t in distinct}
    if len(shapes) != 1:
        return " | ".join(distinct)
    shape = shapes.pop()
    columns = list(zip(*(_NUMBER.findall(t) for t in texts), strict=True))
    pieces = shape.split("\0")
    out = [pieces[0]]
    i = 0
    while i < len(columns):
        if pieces[i + 1] == "–" and i + 1 < len(columns):  # a range "a–b": the widest of them
            out.append(_span(columns[i] + columns[i + 1]))
            i += 1
        else:
            out.append(_span(columns[i]))
        out.append(pieces[i + 1])
        i += 1
    return "".join(out)


def _span(values: tuple[str, ...]) -> str:
    if len(set(values)) == 1:
        return values[0]
    lo = min(values, key=_number)
    hi = max(values, key=_number)
    return lo if _number(lo) == _number(hi) else f"{lo}–{hi}"


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def ranges(measured: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Return every numeric value of the runs' measured dicts as [min, max], by dotted path."""
    seen: dict[str, list[float]] = {}
    for m in measured:
        for path, value in _leaves(m):
            seen.setdefault(path, []).append(value)
    return {p: [min(v), max(v)] for p, v in seen.items()}


def _leaves(value: Any, path: str = "") -> list[tuple[str, float]]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [(path, value)] if math.isfinite(value) else []
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list) and len(value) <= 50:
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{path}[{i}]")]
    return []


def rejudge(result: dict[str, Any]) -> dict[str, list[str]]:
    """Judge a stored reproduce document again from its measured values alone.

    Return, per finding, the checks whose stored ok differs from the one judged now (empty when
    the file agrees with today's judges): a file edited by hand, or judged by other code, shows.
    """
    out = {}
    for finding, f in result["findings"].items():
        entry = get(finding)
        runs = f.get("per_run") or [{"measured": f["measured"], "verdict": f["verdict"]}]
        knobs = entry.module.Knobs.from_json(f["knobs"])
        differ: list[str] = []
        for n, r in enumerate(runs, 1):
            now = entry.module.judge(r["measured"], knobs).to_json()["checks"]
            stored = r["verdict"]["checks"]
            for name in sorted(set(now) | set(stored)):
                a, b = now.get(name, {}).get("ok"), stored.get(name, {}).get("ok")
                if a != b:
                    differ.append(f"run {n}: {name}: stored {_ok(b)}, judged now {_ok(a)}")
        out[finding] = differ
    return out


def _ok(value: bool | None) -> str:
    return "absent" if value is None else (OK if value else NOT_OK)


def table(result: dict[str, Any]) -> str:
    """Return one row per finding: id, the article's claim, what was measured, reproduced."""
    rows = [("id", "the article", "measured here", "reproduced")]
    for finding, f in result["findings"].items():
        runs = f.get("runs", 1)
        k = f.get("reproduced_runs", int(f["reproduced"]))
        mark = ("yes" if f["reproduced"] else "NO") + (f" ({k} of {runs})" if runs > 1 else "")
        rows.append((finding, f["claim"], f["summary"], mark))
    if len(rows) == 1:
        return "no findings registered yet"
    widths = [min(60, max(len(r[i]) for r in rows)) for i in range(4)]
    lines = []
    for r in rows:
        lines.append("  ".join(_cut(c, w).ljust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(lines)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _versions() -> dict[str, str]:
    out = {}
    for name in ("psycopg", "psycopg-pool", "pandas", "altair", "ipywidgets", "jupyterlab"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def write_json(result: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=2, default=str) + "\n")
