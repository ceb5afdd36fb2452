"""Finding horizon: while a holder keeps a transaction open, the fetch reads more and more buffers.

Buffers, not milliseconds: an EXPLAIN (ANALYZE, BUFFERS) of the fetch at every block's end.
The horizon is cluster-wide, so another session's long transaction on a shared server can hold
it for a "free" run too: those checks retry when the monitor saw such a foreign holder.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tenantlab import db
from tenantlab.experiments import horizon

sys.path.insert(0, str(Path(__file__).resolve().parent))
from notebooks import run_clean


def _run(admin_dsn: str, **kw: Any) -> tuple[pd.DataFrame, dict]:
    """Run; once more (up to 3 times) when someone else's long transaction held the horizon."""
    for _ in range(3):
        df, summary = horizon.run(dsn=admin_dsn, wait_clear=20, **kw)
        if not summary["foreign_blocks"]:
            break
    return df, summary


def test_held_fetch_reads_more_at_the_end_and_few_after_release(admin_dsn: str) -> None:
    df, summary = _run(admin_dsn, jobs=6000, block=1000, holder="xid", release_after=5)
    held, after = df[df["held"]], df[~df["held"]]
    assert held["block"].tolist() == [1, 2, 3, 4, 5] and after["block"].tolist() == [6]
    start, end = summary["explain_start"]["buffers"], int(held["buffers"].iloc[-1])
    assert end >= 3 * start, f"held: {start} buffers at the start, {end} at the end"
    assert held["buffers"].is_monotonic_increasing
    assert int(after["buffers"].iloc[0]) <= end / 2, df[["block", "held", "buffers"]]


def _reads_far_less_than_held(admin_dsn: str, holder: str | None) -> tuple[int, int]:
    """Return end buffers of a run with holder and of one with an xid holder (3 tries)."""
    for _ in range(3):
        other, _ = _run(admin_dsn, jobs=4000, block=1000, holder=holder)
        held, _ = _run(admin_dsn, jobs=4000, block=1000, holder="xid")
        assert held["held"].all()
        ends = int(other["buffers"].iloc[-1]), int(held["buffers"].iloc[-1])
        # A short-lived foreign holder between two monitor samples can still slip through.
        if ends[0] * 2 <= ends[1]:
            break
    return ends


def test_free_fetch_reads_far_less_than_held(admin_dsn: str) -> None:
    free, held = _reads_far_less_than_held(admin_dsn, None)
    assert free * 2 <= held


@pytest.mark.parametrize(("holder", "design"), [("rr", "delete"), ("xid", "done")])
def test_repeatable_read_and_done_status_climb_too(admin_dsn: str, holder: str,
                                                   design: str) -> None:
    df, summary = _run(admin_dsn, jobs=4000, block=1000, holder=holder, design=design)
    assert int(df["buffers"].iloc[-1]) >= 3 * summary["explain_start"]["buffers"]


def test_read_committed_reader_holds_nothing(admin_dsn: str) -> None:
    rc, held = _reads_far_less_than_held(admin_dsn, "rc")
    assert rc * 2 <= held


def test_an_interrupted_run_leaves_nothing_open(admin_dsn: str) -> None:
    seen: dict[str, Any] = {}

    def interrupt(row: dict) -> None:
        seen.update(pids=row["pids"], db=row["sample"].holders)
        if row["block"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        horizon.run(dsn=admin_dsn, jobs=4000, block=1000, holder="xid", progress=interrupt,
                    wait_clear=0)
    assert len(seen["pids"]) == 3
    with db.connect(admin_dsn, "check", autocommit=True) as conn:
        left = conn.execute("select pid from pg_stat_activity where pid = any(%s)",
                            (seen["pids"],)).fetchall()
    assert left == []


def test_bad_parameters_say_what_is_valid() -> None:
    with pytest.raises(horizon.HorizonError, match="xid, rr, rc"):
        horizon.run(holder="serializable")
    with pytest.raises(horizon.HorizonError, match="delete, done"):
        horizon.run(design="truncate")


@pytest.mark.notebook
def test_notebook_07_runs_top_to_bottom(admin_dsn: str) -> None:
    # No verdict asserted: 07's verdict is judged on fetch times, and a test asserts no timing
    # (test_horizon's buffer tests pin the behaviour).
    run_clean("07-the-horizon-and-a-slow-queue.ipynb", admin_dsn)
