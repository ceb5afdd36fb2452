"""Run the findings' experiments and judge each against the article's claim."""

from __future__ import annotations

import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from . import db
from .experiments import REGISTRY, get
from .finding import plain


def run(ids: list[str] | None = None, full: bool = False, echo: bool = True) -> dict[str, Any]:
    """Run the given findings (all when empty); return the JSON document of DESIGN.md."""
    entries = [get(finding) for finding in (ids or REGISTRY)]  # unknown ids fail before a run
    result: dict[str, Any] = {
        "server_version": db.server_version(),
        "full": full,
        "python": platform.python_version(),
        "packages": _versions(),
        "findings": {},
    }
    for entry in entries:
        if echo:
            print(f"{entry.id}: running ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        res = entry.run(full=full)
        result["findings"][entry.id] = {
            "claim": entry.claim,
            "reproduced": res.verdict.valid,
            "measured": plain(res.measured),
            "summary": res.summary or res.verdict.line(),
            "article": entry.article,
            "seconds": round(time.perf_counter() - started, 2),
            "verdict": res.verdict.to_json(),
            "knobs": plain(res.knobs.as_dict()),
        }
    return result


def table(result: dict[str, Any]) -> str:
    """Return one row per finding: id, the article's claim, what was measured, reproduced."""
    rows = [("id", "the article", "measured here", "reproduced")]
    for finding, f in result["findings"].items():
        rows.append((finding, f["claim"], f["summary"], "yes" if f["reproduced"] else "NO"))
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
