"""The matrix: every queue row × every scenario, run N times, as JSON, text, Markdown and HTML.

Cells, in the manner of Hermitage: ✓ (held in every run), ✗ k of N (failed in k runs; the
witness sentences follow the table), ~ (holds only with a non-default setting: the recommended
row passes what the ★ row fails), n/a (the scenario does not apply, or the library is not
installed), ? (indeterminate: the suite could not judge; never ✓). ``wake`` and ``throughput``
are measured, not judged: their cell is the number.

The JSON (a contract): ``{"server_version", "rows": [{"queue", "setting", "version",
"settings", "scenarios": {S: {"result", "runs", "failed_runs", "witness", "measured"}}}]}``.
"""

from __future__ import annotations

import contextlib
import html
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import db
from . import runner
from .adapter import Adapter, Options, rows
from .checks import Result
from .scenarios import MEASURED, SCENARIOS, Scenario

Progress = Callable[[str], None]


def _na(reason: str) -> dict[str, Any]:
    return {"result": "na", "runs": 0, "failed_runs": 0, "witness": [reason], "measured": {}}


def applies(adapter: Adapter, scenario: Scenario) -> str | None:
    """Return why ``scenario`` does not apply to ``adapter`` (n/a), or None when it does."""
    if scenario.feature and scenario.feature not in adapter.features:
        return {"tenant-hook": "no per-job connection hook"}.get(scenario.feature,
                                                                  f"no {scenario.feature}")
    if scenario.pooler:
        from .. import pgbouncer

        if not pgbouncer.installed():
            return "PgBouncer is not installed (apt install pgbouncer, or brew install pgbouncer)"
    return None


def cell(adapter: Adapter, scenario: Scenario, runs: int, options: Options | None = None,
         template: str | None = None) -> dict[str, Any]:
    """Run one scenario ``runs`` times on one row; return its JSON cell."""
    if (why := applies(adapter, scenario)) is not None:
        return _na(why)
    results: list[Result] = []
    seconds = []
    for _ in range(runs):
        started = time.monotonic()
        results.append(scenario.checker(runner.run(adapter, scenario, options=options,
                                                   template=template)))
        seconds.append(round(time.monotonic() - started, 1))
    failed = [r for r in results if r.result == "fail"]
    unsure = [r for r in results if r.result == "indeterminate"]
    verdict = "fail" if failed else "indeterminate" if unsure else "pass"
    witness: list[str] = []
    for i, r in enumerate(results, 1):
        if r.result in ("fail", "indeterminate"):
            witness += [f"run {i}: {w}" if runs > 1 else w for w in r.witness]
    measured = dict(results[-1].measured)
    for key in ("median_ms", "max_ms", "jobs_per_s"):
        values = [r.measured[key] for r in results if r.measured.get(key) is not None]
        if len(values) > 1:
            measured[key] = [min(values), max(values)]
    measured["seconds"] = seconds if runs > 1 else seconds[0]
    return {"result": verdict, "runs": runs, "failed_runs": len(failed), "witness": witness,
            "measured": measured}


def run(queues: list[str] | None = None, scenarios: list[str] | None = None, runs: int = 1,
        progress: Progress | None = None, options: Options | None = None) -> dict[str, Any]:
    """Run the matrix; return its JSON document."""
    picked = [SCENARIOS[s] for s in (scenarios or list(SCENARIOS))]
    adapters = list(rows(queues))
    started = time.monotonic()
    out: dict[str, Any] = {"server_version": db.server_version(),
                           "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                           "runs": runs, "rows": []}
    total, done = len(adapters) * len(picked), 0
    for a in adapters:
        version = a.version()
        row: dict[str, Any] = {"queue": a.name, "setting": a.setting, "version": version,
                               "settings": dict(a.settings), "links": dict(a.links),
                               "promises": a.promises, "scenarios": {}}
        if version is None:
            row["install_hint"] = a.install_hint
        with contextlib.ExitStack() as stack:
            template = (stack.enter_context(runner.installed(a)) if version is not None
                        else None)
            for s in picked:
                done += 1
                if version is None:
                    row["scenarios"][s.id] = _na(f"not installed: {a.install_hint}")
                    continue
                c = row["scenarios"][s.id] = cell(a, s, runs, options, template)
                if progress:
                    progress(f"[{done}/{total}] {a.name} {star(a.setting)} {s.id}: "
                             f"{mark(c, s.id)} ({_secs(c):.1f} s)")
        out["rows"].append(row)
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def _secs(c: dict[str, Any]) -> float:
    s = c["measured"].get("seconds", 0)
    return float(sum(s)) if isinstance(s, list) else float(s)


def star(setting: str) -> str:
    return "★" if setting == "default" else "recommended"


def mark(c: dict[str, Any], scenario: str, default_failed: bool = False) -> str:
    """Return one cell's text: ✓, ✗ k of N, ~, n/a, ?, or the measured number."""
    result = c["result"]
    if result == "na":
        return "n/a"
    if result == "indeterminate":
        return "?"
    if result == "fail":
        return f"✗ {c['failed_runs']} of {c['runs']}"
    if scenario in MEASURED:
        m = c["measured"]
        value = m.get("median_ms") if scenario == "wake" else m.get("jobs_per_s")
        if isinstance(value, list):
            value = f"{value[0]:g}-{value[1]:g}"
        return f"{value} ms" if scenario == "wake" else f"{value}/s"
    return "~" if default_failed else "✓"


def marks(result: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Return each row with its cells' texts (``~`` where only a non-default setting holds)."""
    failed_by_default = {(r["queue"], s) for r in result["rows"] if r["setting"] == "default"
                         for s, c in r["scenarios"].items() if c["result"] == "fail"}
    return [(r, {s: mark(c, s, r["setting"] != "default" and (r["queue"], s) in failed_by_default)
                 for s, c in r["scenarios"].items()}) for r in result["rows"]]


def columns(result: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for r in result["rows"]:
        seen += [s for s in r["scenarios"] if s not in seen]
    return seen


def witnesses(result: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """Return (row label, scenario, sentences) for every ✗ and ? cell."""
    return [(f"{r['queue']} {star(r['setting'])}", s, c["witness"])
            for r in result["rows"] for s, c in r["scenarios"].items()
            if c["result"] in ("fail", "indeterminate")]


def table(result: dict[str, Any]) -> str:
    """Return the matrix as plain text, then the witness of every ✗ and ?."""
    cols = columns(result)
    head = ["queue", "setting", "version", *cols]
    body = [[r["queue"], star(r["setting"]), r["version"] or "not installed",
             *[m.get(s, "") for s in cols]] for r, m in marks(result)]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
             for line in [head, *body]]
    lines.append("")
    for r in result["rows"]:
        if r.get("install_hint") and r["version"] is None:
            lines.append(f"{r['queue']} {star(r['setting'])}: not installed: {r['install_hint']}")
    for label, s, sentences in witnesses(result):
        for w in sentences:
            lines.append(f"{label} {s}: {w}")
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    """Return the matrix as a Markdown table (the README's), the promises and the witnesses."""
    cols = columns(result)
    lines = [f"Measured by `tenantlab check --runs {result.get('runs', 1)}` on PostgreSQL "
             f"{result['server_version']}, {result.get('date', '')} "
             f"({result.get('seconds', '?')} s for the whole matrix).", "",
             "| queue | setting | version | " + " | ".join(f"`{c}`" for c in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    for r, m in marks(result):
        cells = [r["queue"], star(r["setting"]), r["version"] or "not installed",
                 *[m.get(c, "") for c in cols]]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    for r in result["rows"]:
        lines.append(f"- **{r['queue']} {star(r['setting'])}** promises: {r['promises']}")
    found = witnesses(result)
    if found:
        lines += ["", "Witnesses:", ""]
        for label, s, sentences in found:
            lines += [f"- {label}, `{s}`: {w}" for w in sentences]
    return "\n".join(lines)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tenantlab check: queues under failure</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 70rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ padding: .2rem .6rem; text-align: left;
       border-bottom: 1px solid #eee; }}
.pass {{ color: #2ca02c; }} .fail {{ color: #d62728; }} .na, .indeterminate {{ color: #888; }}
li {{ margin: .2rem 0; }} small {{ color: #666; }}
</style></head><body>
<h1>tenantlab check: every failure mode, against each queue</h1>
<p>PostgreSQL {server}; {date}; {runs} run(s) per cell; the whole matrix took {seconds} s.
✓ held in every run; ✗ k of N failed in k runs; ~ holds only with a non-default setting;
n/a does not apply; ? could not be judged (never ✓).</p>
<table><tr><th>queue</th><th>setting</th><th>version</th>{heads}</tr>{rows}</table>
<h2>What each row promises, and its settings</h2><ul>{promises}</ul>
<h2>Witnesses</h2><ul>{witnesses}</ul>
</body></html>
"""


def page(result: dict[str, Any]) -> str:
    """Return the matrix as one offline HTML page."""
    e = html.escape
    cols = columns(result)
    rows_html = "".join(
        f"<tr><td>{e(r['queue'])}</td><td>{e(star(r['setting']))}</td>"
        f"<td>{e(r['version'] or 'not installed')}</td>"
        + "".join(f"<td class=\"{r['scenarios'][c]['result'] if c in r['scenarios'] else ''}\" "
                  f"title=\"{e(' '.join(r['scenarios'].get(c, {}).get('witness', [])))}\">"
                  f"{e(m.get(c, ''))}</td>" for c in cols) + "</tr>"
        for r, m in marks(result))
    promises = "".join(
        f"<li><b>{e(r['queue'])} {e(star(r['setting']))}</b>: {e(r['promises'])}<br><small>"
        + "; ".join(f"{e(k)}: {e(str(v))}" + (f" (<a href=\"{e(r['links'][k])}\">why</a>)"
                                            if k in r.get("links", {}) else "")
                    for k, v in r["settings"].items())
        + (f"<br>install: {e(r['install_hint'])}" if r.get("install_hint") else "")
        + "</small></li>" for r in result["rows"])
    found = "".join(f"<li><b>{e(label)}</b>, <code>{e(s)}</code>: {e(w)}</li>"
                    for label, s, sentences in witnesses(result) for w in sentences)
    return PAGE.format(server=e(result["server_version"]), date=e(result.get("date", "")),
                       runs=result.get("runs", 1), seconds=result.get("seconds", "?"),
                       heads="".join(f"<th>{e(c)}</th>" for c in cols), rows=rows_html,
                       promises=promises, witnesses=found or "<li>none</li>")


def write_json(result: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


def write_html(result: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(page(result))


def stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
