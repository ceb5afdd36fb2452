"""The matrix: every queue row × every scenario, run N times, as JSON, text, Markdown and HTML.

Cells, in the manner of Hermitage: ✓ (held in every run; a safety cell shows the time its job
took to become final), ✗ k of N (failed in k runs; the witness sentences follow the table),
◷ T (bounded so far, and the row's own settings make the job final after T, past the
scenario's cap: not observed, never ✓), ~ (holds only with a non-default setting: the
recommended row passes what the ★ row fails), n/a (the scenario does not apply: no takeover, a
job shorter than the row's timeout, not supported by its docs, or the library is not
installed), ? (indeterminate: the suite could not judge; never ✓). ``(k exits)`` after a ✓: no
job lost, but the worker process exited k times and the suite restarted it, as the library's
documented supervision would. ``wake`` and ``throughput`` are measured, not judged: their cell
is the number.

The JSON (a contract): ``{"server_version", "rows": [{"queue", "setting", "version",
"settings", "scenarios": {S: {"result", "runs", "failed_runs", "witness", "measured"}}}]}``;
``result`` is pass / fail / capped / na / indeterminate.
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
from . import repro, runner
from .adapter import Adapter, Options, policy_of, rows
from .checks import Result, human
from .scenarios import FREEZE, MEASURED, SCENARIOS, Scenario

Progress = Callable[[str], None]
KIT = ("naive", "jobqueue")  # the kit's own rows: their ✗ are the lesson, not a peer's claim
ROOT = Path(__file__).resolve().parents[2]


def _na(reason: str) -> dict[str, Any]:
    return {"result": "na", "runs": 0, "failed_runs": 0, "witness": [reason], "measured": {}}


def applies(adapter: Adapter, scenario: Scenario) -> str | None:
    """Return why ``scenario`` does not apply to ``adapter`` (n/a), or None when it does."""
    if scenario.feature and scenario.feature not in adapter.features:
        return {"tenant-hook": "no per-job connection hook",
                "event-loop": "no event loop: its worker runs jobs in threads"}.get(
                    scenario.feature, f"no {scenario.feature}")
    if scenario.pooler:
        from .. import pgbouncer

        if "pgbouncer" not in adapter.features:
            return ("not supported by its docs: its docs do not say it runs behind PgBouncer in "
                    "transaction mode")

        if not pgbouncer.installed():
            return "PgBouncer is not installed (apt install pgbouncer, or brew install pgbouncer)"
    return None


def untestable(adapter: Adapter, scenario: Scenario, options: Options) -> str | None:
    """Why a scenario cannot test anything on this row by the row's own settings (n/a, not
    run): an overrun job shorter than its timeout; a takeover its timeout puts past the time
    the late-finish scenario keeps a worker frozen."""
    timeout = policy_of(adapter, options).timeout
    job = 2.5 * options.lease
    if scenario.id in ("overrun", "block-loop") and (timeout is None or timeout >= job):
        why = "it never takes a running job over" if timeout is None else \
            f"its timeout is {human(timeout)}"
        return f"nothing to overrun: the job runs {human(job)} and {why} (not run)"
    if scenario.id == "late-finish" and (timeout is None or timeout + 6 > FREEZE):
        why = "it never takes a running job over" if timeout is None else \
            f"its timeout, {human(timeout)}, is past the {FREEZE:g} s a worker is kept frozen"
        return f"no takeover: {why} (not run)"
    return None


def cell(adapter: Adapter, scenario: Scenario, runs: int, options: Options | None = None,
         template: str | None = None) -> dict[str, Any]:
    """Run one scenario ``runs`` times on one row; return its JSON cell."""
    if (why := applies(adapter, scenario)) is not None:
        return _na(why)
    if (why := untestable(adapter, scenario, options or Options())) is not None:
        return _na(why)
    results: list[Result] = []
    seconds = []
    for _ in range(runs):
        started = time.monotonic()
        results.append(scenario.checker(runner.run(adapter, scenario, options=options,
                                                   template=template)))
        seconds.append(round(time.monotonic() - started, 1))
    failed = [r for r in results if r.result == "fail"]
    kinds = {r.result for r in results}
    verdict = ("fail" if failed else "indeterminate" if "indeterminate" in kinds
               else "capped" if "capped" in kinds else "na" if kinds == {"na"} else "pass")
    witness: list[str] = []
    for i, r in enumerate(results, 1):
        if r.result != "pass" or r.witness:
            witness += [f"run {i}: {w}" if runs > 1 else w for w in r.witness]
    measured = dict(results[-1].measured)
    measured.pop("created", None)
    if "na" in kinds and verdict == "pass":
        measured["earned_runs"] = sum(r.result == "pass" for r in results)
    exits = [r.measured.get("workers_exited") for r in results]
    if any(exits):
        measured["workers_exited"] = max(e or 0 for e in exits)
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
    bouncers = [c["measured"]["pgbouncer"] for r in out["rows"] for c in r["scenarios"].values()
                if isinstance(c["measured"].get("pgbouncer"), dict)]
    if bouncers:
        out["pgbouncer"] = bouncers[0]
    return out


def value(v: Any) -> str:
    """A setting's value as text (a recommended one is ``{"value", "source"}``)."""
    return str(v["value"]) if isinstance(v, dict) and "value" in v else str(v)


def sources(row: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Return (setting, value, url, quote) for each setting of a row that quotes its docs."""
    return [(k, value(v), v["source"]["url"], v["source"]["quote"])
            for k, v in row["settings"].items()
            if isinstance(v, dict) and isinstance(v.get("source"), dict)]


LEGEND = (
    "★ is each library's true defaults, ours included (jobqueue: lease 30 s, reaper grace 30 s "
    "past the lease, a reaper run every 5 s). **scaled** is the same defaults with every timer "
    "that hands a running job to another worker set to one lease, 2 s, for every queue alike "
    "(jobqueue: lease and reaper grace; PgQueuer: heartbeat_timeout and dequeue_timeout; awa: "
    "heartbeat staleness, its interval and rescue scan a quarter of it; procrastinate: its "
    "heartbeat timers, though nothing takes a job over without its stalled-jobs recipe). "
    "**recommended** is what each library's docs recommend, each setting quoted below; where "
    "the docs tie a timer to \"the longest job plus a margin\", it is sized from the suite's "
    "longest job (5 s) plus 3 s; procrastinate's stalled-jobs sweep runs every 2 s instead of "
    "the docs' example of every 10 minutes. A scenario's bound is a cap: a trial is watched "
    "until the row's own settings make its job final, at most the cap. Safety cells: ✓ T = "
    "bounded (executions within the row's attempt budget) and final after T; ✗ = more "
    "executions than the budget however fast, never final by its settings, or not final when "
    "its settings said; ◷ T = bounded so far, and its settings make the job final only after T, "
    "past the cap (not observed, never ✓). n/a (no takeover): the frozen worker's job was never "
    "taken over, so nothing was fenced; n/a (nothing to overrun): the job is shorter than the "
    "row's timeout; n/a (not supported by its docs): its docs do not say it runs behind "
    "PgBouncer. (k exits): no job lost under supervision, but the worker process exited k times "
    "and the suite restarted it, as `restart_on_failure` or systemd would. `block-loop` is "
    "against the docs: blocking work called on the event loop.")


def _secs(c: dict[str, Any]) -> float:
    s = c["measured"].get("seconds", 0)
    return float(sum(s)) if isinstance(s, list) else float(s)


def star(setting: str) -> str:
    return "★" if setting == "default" else setting


def _final_time(c: dict[str, Any], key: str) -> float | None:
    m = c["measured"]
    for k, v in m.items():
        if k.endswith(key) and isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
    return None


def mark(c: dict[str, Any], scenario: str, default_failed: bool = False) -> str:
    """Return one cell's text: ✓, ✗ k of N, ~, n/a, ?, or the measured number."""
    result = c["result"]
    if result == "na":
        why = " ".join(c.get("witness", []))
        for short in ("no takeover", "not supported by its docs", "nothing to overrun"):
            if short in why:
                return f"n/a ({short})"
        return "n/a"
    if result == "indeterminate":
        return "?"
    if result == "fail":
        return f"✗ {c['failed_runs']} of {c['runs']}"
    if result == "capped":
        t = _final_time(c, "final_by_settings_s")
        return f"◷ {human(t)}" if t is not None else "◷"
    if scenario in MEASURED:
        m = c["measured"]
        value = m.get("median_ms") if scenario == "wake" else m.get("jobs_per_s")
        if isinstance(value, list):
            value = f"{value[0]:g}-{value[1]:g}"
        if scenario == "wake":
            poll = m.get("poll_s")
            return f"{value} ms" + (f" (poll {poll:g} s)" if isinstance(poll, int | float) else "")
        c = m.get("concurrency")
        return f"{value}/s" + (f" ({c})" if c and not str(c).startswith("1 job") else "")
    text = "~" if default_failed else "✓"
    t = _final_time(c, "_final_s")
    if scenario in ("poison", "crash") and t is not None:
        text += f" {human(t)}"
    if c["measured"].get("earned_runs") is not None:
        text += f" ({c['measured']['earned_runs']} of {c['runs']} with a takeover)"
    if c["measured"].get("workers_exited"):
        text += f" ({c['measured']['workers_exited']} exits)"
    return text


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
    """Return (row label, scenario, sentences) for every ✗, ◷ and ? cell."""
    return [(f"{r['queue']} {star(r['setting'])}", s, c["witness"])
            for r in result["rows"] for s, c in r["scenarios"].items()
            if c["result"] in ("fail", "indeterminate", "capped")]


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
    lines += ["", LEGEND, ""]
    if result.get("note"):
        lines += [result["note"], ""]
    for again in result.get("reruns", []):
        lines += [f"Run again on {again['date']} ({again['seconds']} s): "
                  f"{', '.join(f'`{x}`' for x in again['scenarios'])} of "
                  f"{', '.join(again['queues'])}, because {again['why']}.", ""]
    if (pb := result.get("pgbouncer")) is not None:
        lines += [f"PgBouncer {pb.get('version')}: pool_mode {pb.get('pool_mode')}, "
                  f"default_pool_size {pb.get('default_pool_size')}, max_prepared_statements "
                  f"{pb.get('max_prepared_statements')}; each row with its docs' driver "
                  "settings for a pooler (listed with its settings).", ""]
    for r in result["rows"]:
        lines.append(f"- **{r['queue']} {star(r['setting'])}** promises: {r['promises']}")
        for k, v, url, quote in sources(r):
            lines.append(f"  - {k} = {v} ([source]({url}): \"{quote}\")")
    found = witnesses(result)
    if found:
        lines += ["", "Witnesses (each ✗ of a peer links to a standalone script that reproduces "
                  "it with that library and its driver only):", ""]
        for r in result["rows"]:
            label = f"{r['queue']} {star(r['setting'])}"
            for sc, c in r["scenarios"].items():
                if c["result"] not in ("fail", "indeterminate", "capped"):
                    continue
                link = ""
                if c["result"] == "fail" and r["queue"] not in KIT:
                    script = repro.script(r["queue"], r["setting"], sc)
                    link = (f" ([script]({script.relative_to(ROOT).as_posix()}))" if script
                            else " (no standalone script yet)")
                lines += [f"- {label}, `{sc}`: {w}" + (link if i == 0 else "")
                          for i, w in enumerate(c["witness"])]
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
        + "; ".join(f"{e(k)}: {e(value(v))}" + (f" (<a href=\"{e(r['links'][k])}\">why</a>)"
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
