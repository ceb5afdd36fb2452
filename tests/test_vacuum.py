"""Finding vacuum: which long jobs leave dead tuples that VACUUM may not remove yet."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tenantlab import db
from tenantlab.experiments import vacuum

sys.path.insert(0, str(Path(__file__).resolve().parent))
from notebooks import run_clean

SHORT = 200

VERBOSE = """finished vacuuming "x.public.jobs": index scans: 0
pages: 0 removed, 3 remain, 3 scanned (100.00% of total)
tuples: 12 removed, 401 remain, 400 are dead but not yet removable
removable cutoff: 7461, which was 3 XIDs old when operation ended"""


@pytest.fixture(scope="module")
def outcome(admin_dsn: str) -> pd.DataFrame:
    """All five variants once, with a short long job (it stays until VACUUM has run)."""
    df, _ = vacuum.run(dsn=admin_dsn, long_seconds=0.3, short=SHORT)
    return df.set_index("variant")


def test_parse_verbose_reads_the_tuples_line() -> None:
    assert vacuum.parse_verbose(["vacuuming ...", VERBOSE]) == {
        "removable": 12, "remain": 401, "dead_not_removable": 400, "cutoff_xids_old": 3}
    with pytest.raises(vacuum.VacuumError, match="no tuples line"):
        vacuum.parse_verbose(["nothing here"])


@pytest.mark.parametrize("variant", [v.name for v in vacuum.VARIANTS if v.holds_back])
def test_these_long_jobs_hold_vacuum_back(outcome: pd.DataFrame, variant: str) -> None:
    row = outcome.loc[variant]
    assert row["short_jobs"] == SHORT
    # Every short job left dead row versions behind: none may go while the long job runs.
    assert row["dead_not_removable"] >= SHORT
    assert row["removable"] == 0
    assert row["long_job_holds"] == ("snapshot" if variant == "repeatable_read" else "xid")


@pytest.mark.parametrize("variant", [v.name for v in vacuum.VARIANTS if not v.holds_back])
def test_these_long_jobs_hold_nothing(outcome: pd.DataFrame, variant: str) -> None:
    row = outcome.loc[variant]
    assert row["short_jobs"] == SHORT
    assert row["dead_not_removable"] == 0
    assert row["long_job_holds"] == "nothing"


def test_an_interrupted_run_ends_the_long_job(admin_dsn: str) -> None:
    seen: dict[str, Any] = {}

    def interrupt(event: dict) -> None:
        if event["phase"] == "holding":
            seen["pid"] = event["long_job_pid"]
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        vacuum.run(dsn=admin_dsn, long_seconds=60, short=SHORT, variants=("repeatable_read",),
                   progress=interrupt)
    with db.connect(admin_dsn, "check", autocommit=True) as conn:
        left = conn.execute("select pid, state from pg_stat_activity where pid = %s",
                            (seen["pid"],)).fetchall()
    assert left == []


def test_unknown_variant_says_what_is_valid() -> None:
    with pytest.raises(vacuum.VacuumError, match="single_for_update"):
        vacuum.run(variants=("lease_forever",))


@pytest.mark.notebook
def test_notebook_06_runs_top_to_bottom(admin_dsn: str) -> None:
    _, text = run_clean("06-long-transactions-and-vacuum.ipynb", admin_dsn)
    # The verdict is judged from dead tuples, not time: which holders kept them unremovable.
    assert "✓ as the article says" in text and "✗" not in text
