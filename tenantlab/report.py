"""Write the reproduction report: one HTML page, per finding the claim, the measurement, the
verdict and a chart. Charts are rendered to SVG in Python (vl-convert), so the page opens
without network access.
"""

from __future__ import annotations

import html
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .experiments import get

Measured = dict[str, Any]


def chart_of(finding: str) -> Callable[[Measured], Any] | None:
    """Return the finding's report chart: ``report_chart`` in ``tenantlab.charts.<module>``."""
    try:
        module = importlib.import_module(f"tenantlab.charts.{get(finding).module_name}")
    except ModuleNotFoundError:
        return None
    return getattr(module, "report_chart", None)


def svg(finding: str, measured: Measured) -> str:
    """Render a finding's chart to inline SVG; a short note when it cannot be drawn."""
    import vl_convert as vlc

    make = chart_of(finding)
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
<p>PostgreSQL {server}; Python {python}; {packages}. Size: {size}. {repeat}</p>
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
        f"<td class=\"{'yes' if c['ok'] else 'no'}\">{'✓' if c['ok'] else '✗'}"
        f"{_tally(c)}{' (timing)' if c.get('timing') else ''}</td></tr>"
        for name, c in verdict["checks"].items())
    return (f"<table class=\"checks\"><tr><th>check</th><th>{html.escape(verdict['against'])}</th>"
            f"<th>measured here</th><th></th></tr>{rows}</table>")


def _tally(item: dict[str, Any]) -> str:
    """Return " k of N" for a check or finding judged over several runs ("" for one run)."""
    runs = item.get("runs", 1)
    ok = item.get("ok_runs", item.get("reproduced_runs"))
    return f" {ok} of {runs}" if runs > 1 and ok is not None else ""


def write(result: dict[str, Any], path: str | Path) -> None:
    """Write the report page for a `reproduce.run` result."""
    rows, sections = [], []
    for finding, f in result["findings"].items():
        mark = (f'<span class="yes">✓ reproduced{_tally(f)}</span>' if f["reproduced"] else
                f'<span class="no">✗ not reproduced'
                f'{f" (reproduced{_tally(f)})" if _tally(f) else ""}</span>')
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
        repeat=(f"Every finding ran {result['repeat']} times; a number in a measured text is "
                "the range over the runs." if result.get("repeat", 1) > 1 else ""),
        rows="".join(rows), sections="".join(sections)))
