"""Write the reproduction report: one HTML page, per finding the claim, the measurement, the
verdict and a chart. Charts are rendered to SVG in Python (vl-convert), so the page opens
without network access.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

Measured = dict[str, Any]
WIDTH = 420


def _leak(m: Measured) -> alt.Chart:
    rows = [{"variant": v, "after job": i + 1, "rows seen by the next borrower": n}
            for v, seen in m["seen_after_job"].items() for i, n in enumerate(seen)]
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        x=alt.X("after job:O"), y="rows seen by the next borrower:Q",
        color=alt.condition(alt.datum["rows seen by the next borrower"] > 0,
                            alt.value("#d62728"), alt.value("#2ca02c")),
        column=alt.Column("variant:N", title=None),
    ).properties(width=90, height=160)


def _reset(m: Measured) -> alt.Chart:
    opened = m.get("connections_opened", {})
    rows = [{"variant": v, "ms per job": ms, "connections opened": opened.get(v)}
            for v, ms in m["ms_per_job"].items() if ms is not None]
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        y=alt.Y("variant:N", sort="-x", title=None), x="ms per job:Q",
        tooltip=["variant", "ms per job", "connections opened"],
    ).properties(width=WIDTH, height=160)


def _poison(m: Measured) -> alt.Chart:
    rows = [{"design": "unhandled", "what": "picked", "n": m["unhandled"]["picked"]},
            {"design": "unhandled", "what": "attempts counted", "n": m["unhandled"]["attempts"]},
            {"design": "handled", "what": "attempts counted", "n": m["handled"]["attempts"]}]
    return _bars(rows, "design", "what", "n")


def _crash(m: Measured) -> alt.Chart:
    rows = [{"design": d, "what": k, "n": v} for d in ("single", "leased")
            for k, v in m[d].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return _bars(rows, "design", "what", "n")


def _overrun(m: Measured) -> alt.Chart:
    rows = [{"variant": v, "what": what, "n": n}
            for what in ("executions", "completions") for v, n in m[what].items()]
    return _bars(rows, "variant", "what", "n")


def _vacuum(m: Measured) -> alt.Chart:
    rows = [{"variant": v, "tuples": k.replace("_", " "), "n": d[k]}
            for v, d in m.items() if isinstance(d, dict) and "removable" in d
            for k in ("removable", "dead_not_removable")]
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        y=alt.Y("variant:N", title=None), x=alt.X("n:Q", stack=True, title="dead tuples"),
        color=alt.Color("tuples:N", scale=alt.Scale(domain=["removable", "dead not removable"],
                                                    range=["#2ca02c", "#d62728"])),
    ).properties(width=WIDTH, height=160)


def _horizon(m: Measured) -> alt.Chart:
    rows = [{"block": i + 1, "holder": k, "median fetch ms": ms}
            for k, series in m["block_median_ms"].items() for i, ms in enumerate(series)]
    return alt.Chart(pd.DataFrame(rows)).mark_line(point=True).encode(
        x="block:O", y="median fetch ms:Q",
        color=alt.Color("holder:N", scale=alt.Scale(domain=["held", "free"],
                                                    range=["#d62728", "#2ca02c"])),
    ).properties(width=WIDTH, height=200)


def _rls_jobs(m: Measured) -> alt.Chart:
    rows = [{"what": k.replace("_", " "), "jobs": m[k]}
            for k in ("total_jobs", "visible_without_tenant", "claimed", "visible_after_fix")
            if k in m]
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        y=alt.Y("what:N", sort=None, title=None), x="jobs:Q",
    ).properties(width=WIDTH, height=120)


def _bars(rows: list[dict], group: str, what: str, n: str) -> alt.Chart:
    return alt.Chart(pd.DataFrame(rows)).mark_bar().encode(
        y=alt.Y(f"{what}:N", title=None), x=f"{n}:Q", color=f"{what}:N",
        row=alt.Row(f"{group}:N", title=None),
    ).properties(width=WIDTH - 100, height=60)


CHARTS: dict[str, Callable[[Measured], alt.Chart]] = {
    "leak": _leak, "reset": _reset, "poison": _poison, "crash": _crash, "overrun": _overrun,
    "vacuum": _vacuum, "horizon": _horizon, "rls-jobs": _rls_jobs,
}


def svg(finding: str, measured: Measured) -> str:
    """Render a finding's chart to inline SVG; a short note when it cannot be drawn."""
    import vl_convert as vlc

    make = CHARTS.get(finding)
    if make is None:
        return "<p><em>no chart for this finding</em></p>"
    try:
        return vlc.vegalite_to_svg(make(measured).to_dict())
    except (KeyError, TypeError, ValueError) as e:
        return f"<p><em>chart not drawn: {html.escape(str(e))}</em></p>"


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tenantlab: reproduction report</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; }}
section {{ border-top: 1px solid #ddd; padding: 1rem 0; }}
.yes {{ color: #2ca02c; }} .no {{ color: #d62728; }}
pre {{ background: #f6f6f6; padding: .5rem; overflow-x: auto; font-size: .8rem; }}
table {{ border-collapse: collapse; }} td, th {{ padding: .2rem .6rem; text-align: left; }}
</style></head><body>
<h1>tenantlab: the article's findings, reproduced</h1>
<p>PostgreSQL {server}; Python {python}; {packages}. Size: {size}.</p>
<table><tr><th>finding</th><th>verdict</th><th>seconds</th></tr>{rows}</table>
{sections}
</body></html>
"""


def _checks(verdict: dict[str, Any] | None) -> str:
    """Render a finding's verdict checks (``reproduce --json``'s ``verdict``) as a table."""
    if not verdict:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{html.escape(c['expected'])}</td>"
        f"<td>{html.escape(c['measured'])}</td>"
        f"<td class=\"{'yes' if c['ok'] else 'no'}\">{'✓' if c['ok'] else '✗'}</td></tr>"
        for name, c in verdict["checks"].items())
    return (f"<table class=\"checks\"><tr><th>check</th><th>{html.escape(verdict['against'])}</th>"
            f"<th>measured here</th><th></th></tr>{rows}</table>")


def write(result: dict[str, Any], path: str | Path) -> None:
    """Write the report page for a `reproduce.run` result."""
    rows, sections = [], []
    for finding, f in result["findings"].items():
        mark = '<span class="yes">✓ reproduced</span>' if f["reproduced"] else \
            '<span class="no">✗ not reproduced</span>'
        rows.append(f'<tr><td><a href="#{finding}">{finding}</a></td><td>{mark}</td>'
                    f'<td>{f["seconds"]}</td></tr>')
        sections.append(
            f'<section id="{finding}"><h2>{finding} {mark}</h2>'
            f"<p><b>The article:</b> {html.escape(f['claim'])}</p>"
            f"<p><b>Measured here:</b> {html.escape(f.get('summary', ''))}</p>"
            f"{_checks(f.get('verdict'))}"
            f"{svg(finding, f['measured'])}"
            f"<details><summary>measured values</summary><pre>"
            f"{html.escape(json.dumps(f['measured'], indent=2, default=str))}</pre></details>"
            f"<details><summary>the article's numbers</summary><pre>"
            f"{html.escape(json.dumps(f['article'], indent=2, default=str))}</pre></details>"
            "</section>")
    packages = ", ".join(f"{k} {v}" for k, v in result.get("packages", {}).items())
    Path(path).write_text(PAGE.format(
        server=html.escape(result["server_version"]), python=result.get("python", ""),
        packages=html.escape(packages), size="full" if result.get("full") else "workshop",
        rows="".join(rows), sections="".join(sections)))
