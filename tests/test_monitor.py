"""The horizon monitor names who holds the horizon; the idle timeout ends an idle holder."""

from __future__ import annotations

import time

import pandas as pd
import pytest

from tenantlab import db
from tenantlab.monitor import Holder, HolderError, Monitor


def _row(monitor: Monitor, pid: int) -> dict | None:
    h = monitor.sample().holders
    rows = h[h["pid"] == pid].to_dict("records")
    return rows[0] if rows else None


def test_monitor_names_a_holder_with_a_transaction_id(scratch: db.Scratch) -> None:
    with Monitor(scratch.admin, limit=200) as monitor, Holder(scratch.worker, "xid") as holder:
        row = _row(monitor, holder.pid)
        assert row is not None, "the holding session is not in the monitor's table"
        assert pd.notna(row["backend_xid"])
        assert row["state"] == "idle in transaction"
        assert row["datname"] == scratch.name
        assert row["application_name"] == "tenantlab holder xid"
        shown = monitor.sample().table()
        mine = shown[shown["pid"] == holder.pid].iloc[0]
        assert mine["holds"].startswith("xid ") and mine["session"] == "tenantlab holder xid"


def test_repeatable_read_holds_a_snapshot_read_committed_holds_nothing(
        scratch: db.Scratch) -> None:
    with Monitor(scratch.admin, limit=200) as monitor:
        with Holder(scratch.worker, "rr") as rr:
            row = _row(monitor, rr.pid)
            assert row is not None and pd.notna(row["backend_xmin"])
            assert pd.isna(row["backend_xid"])
            shown = monitor.sample().table()
            assert shown[shown["pid"] == rr.pid].iloc[0]["holds"].startswith("snapshot (xmin ")
        with Holder(scratch.worker, "rc") as rc:
            assert _row(monitor, rc.pid) is None, "an idle READ COMMITTED reader holds nothing"


def test_idle_timeout_ends_an_idle_holder(scratch: db.Scratch) -> None:
    with Monitor(scratch.admin, limit=200) as monitor:
        holder = Holder(scratch.worker, "xid", idle_timeout=0.5).open()
        try:
            assert _row(monitor, holder.pid) is not None
            deadline = time.monotonic() + 30
            while holder.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not holder.alive(), "the idle holder outlived its timeout"
            assert _row(monitor, holder.pid) is None
        finally:
            holder.release()
        assert holder.ended_by_timeout


def test_the_timeout_is_set_on_the_holder_only(scratch: db.Scratch) -> None:
    with Holder(scratch.worker, "xid", idle_timeout=0.5) as holder, \
            scratch.connect("worker", "other", autocommit=True) as other:
        assert holder.conn.execute("show idle_in_transaction_session_timeout").fetchone()[0] \
            == "500ms"
        assert other.execute("show idle_in_transaction_session_timeout").fetchone()[0] == "0"


def test_unknown_holder_kind_says_what_is_valid() -> None:
    with pytest.raises(HolderError, match="xid, rr, rc"):
        Holder("", "serializable")
