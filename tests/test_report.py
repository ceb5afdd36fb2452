"""`tenantlab reproduce --json --report` and the README matrix, from a real (small) run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import findings_matrix  # noqa: E402


def test_reproduce_writes_json_report_and_matrix(admin_dsn: str, tmp_path: Path) -> None:
    out, page = tmp_path / "r.json", tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "tenantlab", "reproduce", "leak", "rls-jobs",
         "--json", str(out), "--report", str(page)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, TENANTLAB_DATABASE_URL=admin_dsn))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["server_version"] and set(result["findings"]) == {"leak", "rls-jobs"}
    for f in result["findings"].values():
        assert {"reproduced", "measured", "article", "seconds"} <= set(f)
    seen = result["findings"]["leak"]["measured"]["seen_after_job"]
    assert seen["session"] == [20000, 10000, 6666] and seen["local"] == [0, 0, 0]

    html = page.read_text()
    assert html.count("<svg") >= 2, "every finding gets a chart rendered in Python"
    assert "<script" not in html and "https://" not in html, "the page must open offline"
    assert 'id="leak"' in html and 'id="rls-jobs"' in html

    table = findings_matrix.matrix(result)
    assert "| `leak` |" in table and "| `rls-jobs` |" in table
    marks = ["✓" if f["reproduced"] else "✗" for f in result["findings"].values()]
    assert [row.rsplit("|", 2)[-2].strip() for row in table.splitlines()[4:]] == marks
