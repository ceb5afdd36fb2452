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

from tenantlab import reproduce  # noqa: E402


def test_reproduce_writes_json_report_and_matrix(admin_dsn: str, tmp_path: Path) -> None:
    out, page = tmp_path / "r.json", tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "tenantlab", "reproduce", "leak", "rls-jobs", "--repeat", "2",
         "--json", str(out), "--report", str(page)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, TENANTLAB_DATABASE_URL=admin_dsn))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["server_version"] and set(result["findings"]) == {"leak", "rls-jobs"}
    for f in result["findings"].values():
        assert {"reproduced", "measured", "article", "seconds"} <= set(f)
        # Every finding twice: k of N, every number a range over the runs, each run kept.
        assert f["runs"] == 2 and len(f["per_run"]) == 2
        assert f["reproduced_runs"] == sum(r["reproduced"] for r in f["per_run"])
        assert all(lo <= hi for lo, hi in f["ranges"].values())
    assert result["findings"]["leak"]["ranges"]["seen_after_job.session[0]"] == [20000, 20000]
    assert "of 2)" in done.stdout  # the table says k of N
    # The stored file judged again offline agrees with itself; an edited reading is caught.
    assert reproduce.rejudge(result) == {"leak": [], "rls-jobs": []}
    result["findings"]["leak"]["per_run"][1]["measured"]["seen_after_job"]["local"] = [0, 5, 0]
    assert reproduce.rejudge(result)["leak"], "a leak written into the file must be caught"
    seen = result["findings"]["leak"]["measured"]["seen_after_job"]
    assert seen["session"] == [20000, 10000, 6666] and seen["local"] == [0, 0, 0]

    html = page.read_text()
    assert html.count("<svg") >= 2, "every finding gets a chart rendered in Python"
    assert "<script" not in html and "https://" not in html, "the page must open offline"
    assert 'id="leak"' in html and 'id="rls-jobs"' in html

    table = findings_matrix.matrix(result)
    assert "| `leak` |" in table and "| `rls-jobs` |" in table
    marks = [("✓" if f["reproduced"] else "✗") + f" {f['reproduced_runs']} of 2"
             for f in result["findings"].values()]
    assert [row.rsplit("|", 2)[-2].strip() for row in table.splitlines()[4:]] == marks


def test_numbers_of_several_runs_become_ranges() -> None:
    merge = reproduce.merge_texts
    assert merge(["1.2× (0.4 vs 0.3 ms)", "1.5× (0.45 vs 0.3 ms)"]) == "1.2–1.5× (0.4–0.45 vs 0.3 ms)"
    assert merge(["2,000 of 2,000", "1,990 of 2,000"]) == "1,990–2,000 of 2,000"
    assert merge(["per run 1–2×", "per run 0.5–1.5×"]) == "per run 0.5–2×"  # ranges widen
    assert merge(["no job fails", "fails at job 7"]) == "no job fails | fails at job 7"
    assert merge(["same", "same"]) == "same"
    runs = [{"a": {"b": [1, 2]}, "c": 3.5, "ok": True}, {"a": {"b": [4, 2]}, "c": 1.5}]
    assert reproduce.ranges(runs) == {"a.b[0]": [1, 4], "a.b[1]": [2, 2], "c": [1.5, 3.5]}


def test_a_check_that_failed_in_one_run_fails_over_the_runs() -> None:
    def verdict(ok: bool, measured: str) -> dict:
        return {"valid": ok, "against": "the article",
                "checks": {"rows": {"ok": ok, "expected": "0", "measured": measured}}}
    merged = reproduce.merge_verdicts([verdict(True, "0"), verdict(False, "3"), verdict(True, "0")])
    assert not merged["valid"] and merged["valid_runs"] == 2 and merged["runs"] == 3
    assert merged["checks"]["rows"] == {"ok": False, "expected": "0", "measured": "0–3",
                                        "timing": False, "ok_runs": 2, "runs": 3}
    assert reproduce.summary(merged) == "✗ rows: 0–3 (2 of 3 runs)"
