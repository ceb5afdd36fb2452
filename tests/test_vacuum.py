"""Finding vacuum: which long jobs leave dead tuples that VACUUM may not remove yet."""

from __future__ import annotations

import os
from typing import Any

import pandas as pd
import pytest

from notebooks import run_clean
from tenantlab import db, reproduce
from tenantlab.experiments import vacuum
from tenantlab.finding import Result

SHORT = 200
LAB = tuple(v.name for v in vacuum.VARIANTS if v.kind is None)
EXPORTED = tuple(v.name for v in vacuum.VARIANTS if v.kind is not None)

VERBOSE = """finished vacuuming "x.public.jobs": index scans: 0
pages: 0 removed, 3 remain, 3 scanned (100.00% of total)
tuples: 12 removed, 401 remain, 400 are dead but not yet removable
removable cutoff: 7461, which was 3 XIDs old when operation ended"""


@pytest.fixture(scope="module")
def outcome(admin_dsn: str) -> Result:
    """The lab's five long jobs once, short (each stays until VACUUM has run)."""
    return vacuum.run(vacuum.Knobs(long_seconds=0.5, short_jobs=SHORT, variants=LAB))


@pytest.fixture(scope="module")
def exported(admin_dsn: str) -> Result:
    """The exported worker's two jobs once: a few seconds, VACUUM runs while they sleep."""
    return vacuum.run(vacuum.Knobs(handler_seconds=2.0, short_jobs=SHORT, variants=EXPORTED))


def _rows(res: Result) -> pd.DataFrame:
    assert res.table is not None
    return res.table.set_index("variant")


def test_parse_verbose_reads_the_tuples_line() -> None:
    assert vacuum.parse_verbose(["vacuuming ...", VERBOSE]) == {
        "removable": 12, "remain": 401, "dead_not_removable": 400, "cutoff_xids_old": 3}
    with pytest.raises(vacuum.VacuumError, match="no tuples line"):
        vacuum.parse_verbose(["nothing here"])


@pytest.mark.parametrize("variant", [v.name for v in vacuum.VARIANTS
                                     if v.holds_back and v.kind is None])
def test_these_long_jobs_hold_vacuum_back(outcome: Result, variant: str) -> None:
    row = _rows(outcome).loc[variant]
    assert row["short_jobs"] == SHORT
    # Every short job left dead row versions behind: none may go while the long job runs.
    assert row["dead_not_removable"] >= SHORT
    # None of theirs may go. One row version may: the leased claim's own, committed before the
    # long transaction began (unless a page prune took it first: it varies from run to run).
    assert row["removable"] <= (1 if variant == "leased_wrote" else 0)
    assert row["long_job_holds"] == ("snapshot" if variant == "repeatable_read" else "xid")


@pytest.mark.parametrize("variant", [v.name for v in vacuum.VARIANTS
                                     if not v.holds_back and v.kind is None])
def test_these_long_jobs_hold_nothing(outcome: Result, variant: str) -> None:
    row = _rows(outcome).loc[variant]
    assert row["short_jobs"] == SHORT
    assert row["dead_not_removable"] == 0
    assert row["long_job_holds"] == "nothing"


def test_the_exported_worker_s_reading_job_holds_nothing(exported: Result) -> None:
    # The worker's own bookkeeping must not give the job's transaction an id while it works.
    row = _rows(exported).loc["jobqueue_reads"]
    assert (row["dead_not_removable"], row["removable"]) == (0, SHORT)
    assert row["long_job_holds"] == "nothing"
    assert row["job"] == "done"


def test_the_exported_worker_s_writing_job_holds_every_dead_row_until_its_finish(
        exported: Result) -> None:
    row = _rows(exported).loc["jobqueue_writes"]
    assert (row["dead_not_removable"], row["removable"]) == (SHORT, 0)
    assert row["long_job_holds"] == "xid"
    # Its finish committed: the next VACUUM removed them all.
    assert (row["held_after_finish"], row["job"]) == (0, "done")


def test_the_verdict_names_each_long_job_by_its_label(outcome: Result, exported: Result) -> None:
    for res, names in ((outcome, LAB), (exported, EXPORTED)):
        v = res.verdict
        assert v.valid and v.against == "the expectation", v.line()  # not the article's sizes
        assert [c.name for c in v.checks] == [vacuum.BY_NAME[n].label for n in names]
        assert res.measured["not_as_article"] == []
        assert res.measured["short_jobs"] == SHORT


def test_without_a_holder_the_holding_checks_fail(outcome: Result) -> None:
    # The cause removed: a long job that holds nothing (the lease with its work outside a
    # transaction, measured in this run) in place of each long job that holds VACUUM back.
    m = outcome.measured
    holders = [v for v in vacuum.VARIANTS if v.holds_back and v.kind is None]
    without = vacuum.judge({v.name: m["leased_outside"] for v in holders},
                           vacuum.Knobs(variants=tuple(v.name for v in holders)))
    assert [c.ok for c in without.checks] == [False] * len(holders), without.line()


def test_a_handler_that_writes_nothing_holds_nothing(exported: Result) -> None:
    # The cause removed in the exported worker: no write (its reading job, measured in this
    # run) judged as the writing job fails the writing job's check.
    m = exported.measured
    without = vacuum.judge({"jobqueue_writes": m["jobqueue_reads"]},
                           vacuum.Knobs(variants=("jobqueue_writes",)))
    assert not without.valid and without.checks[0].name == "exported worker, handler writes"


def test_the_verdict_is_decided_from_measured_values() -> None:
    m = {"leased_wrote": {"removable": 40, "dead_not_removable": 0, "seconds": 1.0,
                          "long_job_holds": "nothing"}}
    v = vacuum.judge(m, vacuum.Knobs(variants=("leased_wrote",)))
    assert not v.valid and v.checks[0].name == "lease, work in a transaction that wrote"
    # A writing handler that held only some of the dead rows, or held them past its finish.
    base = {"removable": 0, "dead_not_removable": 200, "long_job_holds": "xid",
            "dead_rows": 200, "held_after_finish": 0, "job": "done"}
    knobs = vacuum.Knobs(variants=EXPORTED)
    assert vacuum.judge({"jobqueue_writes": base}, knobs).valid
    for wrong in ({"dead_not_removable": 150}, {"held_after_finish": 200}, {"job": "running"}):
        assert not vacuum.judge({"jobqueue_writes": base | wrong}, knobs).valid
    v = vacuum.judge({"jobqueue_reads": base}, knobs)
    assert not v.valid and v.checks[0].name == "exported worker, handler reads"
    assert v.checks[0].measured.startswith("200 of 200 dead rows not yet removable")


def test_full_knobs_are_the_articles_sizes() -> None:
    full = vacuum.Knobs.full()
    assert (full.long_seconds, full.handler_seconds, full.short_jobs) == (20.0, 20.0, 5000)
    assert full.is_article_setup() and vacuum.Knobs().is_article_setup()


def test_an_interrupted_run_ends_the_long_job(admin_dsn: str) -> None:
    seen: dict[str, Any] = {}

    def interrupt(event: dict) -> None:
        if event["phase"] == "holding":
            seen["pid"] = event["long_job_pid"]
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        vacuum.run(vacuum.Knobs(long_seconds=60, short_jobs=SHORT,
                                variants=("repeatable_read",)), watch=interrupt)
    with db.connect(admin_dsn, "check", autocommit=True) as conn:
        left = conn.execute("select pid, state from pg_stat_activity where pid = %s",
                            (seen["pid"],)).fetchall()
    assert left == []


def test_an_interrupted_run_ends_the_exported_worker(admin_dsn: str) -> None:
    seen: dict[str, Any] = {}

    def interrupt(event: dict) -> None:
        if event["phase"] == "holding":
            seen.update(event)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        vacuum.run(vacuum.Knobs(handler_seconds=60, short_jobs=SHORT,
                                variants=("jobqueue_writes",)), watch=interrupt)
    with pytest.raises(ProcessLookupError):  # ended and reaped, not left running for 60 s
        os.kill(seen["worker_pid"], 0)
    with db.connect(admin_dsn, "check", autocommit=True) as conn:
        left = conn.execute("select pid, state from pg_stat_activity where pid = %s",
                            (seen["long_job_pid"],)).fetchall()
    assert left == []


def test_unknown_variant_says_what_is_valid() -> None:
    with pytest.raises(vacuum.VacuumError, match="single_for_update"):
        vacuum.run(vacuum.Knobs(variants=("lease_forever",)))


def test_reproduce_vacuum_keys(admin_dsn: str) -> None:
    out = reproduce.run(["vacuum"], echo=False)["findings"]["vacuum"]
    assert out["reproduced"] is True and out["verdict"]["valid"] is True
    m = out["measured"]
    for v in vacuum.VARIANTS:
        keys = {"removable", "dead_not_removable", "long_job_holds"}
        keys |= {"seconds"} if v.kind is None else {"dead_rows", "held_after_finish", "job"}
        assert set(m[v.name]) == keys
    assert {"short_jobs", "long_seconds", "handler_seconds", "seconds_ratio_held_vs_not",
            "not_as_article"} <= set(m)
    assert (m["short_jobs"], m["long_seconds"], m["handler_seconds"], m["not_as_article"]) == (
        2000, 4.0, 2.0, [])


@pytest.mark.notebook
def test_notebook_06_runs_top_to_bottom(admin_dsn: str) -> None:
    _, text = run_clean("06-long-transactions-and-vacuum.ipynb", admin_dsn)
    # The verdict is judged from dead tuples, not time: which holders kept them unremovable.
    assert "✓ as the article says" in text and "✗" not in text
