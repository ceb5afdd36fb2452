"""Watch the xmin horizon: who holds it, what it leaves behind in jobs, what a fetch costs.

The horizon is the oldest transaction id a session may still need. A session holds it with a
transaction id of its own (it wrote, or locked a row) or with a snapshot it keeps between
statements (REPEATABLE READ, a cursor). While it is held, no row version that died after it may
be treated as dead: VACUUM leaves them, and an index scan walks past their entries. The view is
cluster-wide: a holder in another database shows up here too, because a snapshot's xmin counts
the running transactions of every database (FINDINGS.md, "beyond the article").

Sampling and holding are both here, so a notebook can show the holder and then end it:
``Holder`` opens a session that holds the horizon on purpose; ``idle_in_transaction_session_timeout``
set on that session (never globally) ends it when it sits idle in its transaction.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import psycopg

from . import db
from .errors import TenantlabError
from .queries import q

log = logging.getLogger("tenantlab")

#: Holder kinds: a transaction with an id ("xid"), a read-only REPEATABLE READ snapshot ("rr"),
#: a read-only READ COMMITTED transaction idle between statements ("rc", holds nothing).
HOLDER_KINDS = ("xid", "rr", "rc")


class HolderError(TenantlabError, RuntimeError):
    """A holder session could not be opened or was not what was asked for."""


@dataclass
class Sample:
    """One look at the server: the horizon's holders and the jobs table's row versions."""

    at: float
    holders: pd.DataFrame
    tuples: dict[str, Any]
    fetch_ms: float | None = None

    def oldest(self, exclude_pids: set[int] | frozenset[int] = frozenset()) -> dict | None:
        """Return the session holding the oldest horizon (optionally ignoring some pids)."""
        rows = self.holders[~self.holders["pid"].isin(list(exclude_pids))]
        return None if rows.empty else rows.iloc[0].to_dict()

    def foreign(self, own_db: str, min_seconds: float = 1.0) -> list[dict]:
        """Return client sessions outside own_db whose transaction, open min_seconds+, holds it.

        These are other people's long transactions (another experiment, a report): they hold the
        horizon for this database too, so a "free" measurement taken meanwhile is not free.
        """
        h = self.holders
        rows = h[(h["datname"] != own_db) & (h["xact_seconds"].fillna(0) >= min_seconds)
                 & (h["backend_type"] == "client backend")]
        return [
            {k: r[k] for k in ("pid", "datname", "application_name", "state", "xact_seconds")}
            for r in rows.to_dict("records")
        ]

    def table(self) -> pd.DataFrame:
        """Return the holders as a notebook shows them: who, what they hold, for how long."""
        h = self.holders
        holds = [f"xid {x}" if pd.notna(x) else f"snapshot (xmin {m})"
                 for x, m in zip(h["backend_xid"], h["backend_xmin"], strict=True)]
        return pd.DataFrame({
            "pid": h["pid"], "session": h["application_name"], "database": h["datname"],
            "state": h["state"], "holds": holds,
            "xids behind": h["xid_age"].astype("Int64"),
            "open (s)": h["xact_seconds"].round(1),
        })


class Monitor:
    """Sample the horizon's holders and the jobs table's dead tuples on one admin connection."""

    def __init__(self, dsn: str, limit: int = 8) -> None:
        # Admin: pg_stat_activity shows other roles' state and query only to privileged roles.
        self.conn = db.connect(dsn, "monitor", autocommit=True)
        self.limit = limit
        self.samples: list[Sample] = []

    def sample(self, fetch_ms: float | None = None) -> Sample:
        """Take one sample now; ``fetch_ms`` is the latest fetch latency the caller measured."""
        holders = db.frame(self.conn, q("monitor_horizon_holders"), {"limit": self.limit})
        # Counters are flushed by each backend at most once a second: approximate, but live.
        row = self.conn.execute(q("monitor_jobs_tuples")).fetchone()
        names = ["n_live_tup", "n_dead_tup", "n_tup_del", "n_tup_upd", "vacuum_count",
                 "autovacuum_count", "last_autovacuum"]
        tuples = dict(zip(names, row, strict=True)) if row else {}
        s = Sample(at=time.time(), holders=holders, tuples=tuples, fetch_ms=fetch_ms)
        self.samples.append(s)
        return s

    def wait_for_clear(self, own_db: str, timeout: float = 20.0, min_seconds: float = 1.0
                       ) -> list[dict]:
        """Wait up to timeout for no foreign holder; return the ones still there (or [])."""
        deadline = time.monotonic() + timeout
        while True:
            others = self.sample().foreign(own_db, min_seconds)
            if not others or time.monotonic() > deadline:
                if others:
                    log.warning("horizon held by other sessions on the server: %s", others)
                return others
            time.sleep(0.5)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Holder:
    """A session that holds the horizon on purpose until ``release()`` (or its timeout).

    kind "xid": a transaction with a transaction id, idle (what any writing transaction, or a
    ``SELECT ... FOR UPDATE``, is). kind "rr": a read-only REPEATABLE READ transaction that read
    once (a long report, pg_dump). kind "rc": a read-only READ COMMITTED transaction idle between
    statements, which holds nothing. ``idle_timeout`` (seconds) sets
    ``idle_in_transaction_session_timeout`` on this session only.
    """

    dsn: str
    kind: str = "xid"
    idle_timeout: float | None = None
    conn: psycopg.Connection | None = field(default=None, init=False)
    pid: int | None = field(default=None, init=False)
    ended_by_timeout: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.kind not in HOLDER_KINDS:
            raise HolderError(f"holder kind must be one of {', '.join(HOLDER_KINDS)}, "
                              f"not {self.kind!r}")

    def open(self) -> Holder:
        """Open the session and its transaction; return self (idle in transaction)."""
        isolation = (psycopg.IsolationLevel.REPEATABLE_READ if self.kind == "rr"
                     else psycopg.IsolationLevel.READ_COMMITTED)
        self.conn = db.connect(self.dsn, f"holder {self.kind}", autocommit=True)
        try:
            self.pid = self.conn.info.backend_pid
            if self.idle_timeout is not None:
                ms = f"{int(self.idle_timeout * 1000)}ms"
                self.conn.execute(q("holder_set_idle_timeout"), {"timeout": ms})
            self.conn.autocommit = False
            self.conn.isolation_level = isolation
            if self.kind == "xid":
                self.conn.execute(q("holder_take_xid"))
            else:
                self.conn.execute(q("holder_read_jobs"))
        except BaseException:
            self.conn.close()
            raise
        return self

    def alive(self) -> bool:
        """Return whether the session still exists (the timeout may have ended it)."""
        if self.conn is None or self.conn.closed:
            return False
        # Ask from outside: a query on the holder itself would end its idleness.
        with db.connect(self.dsn, "holder check", autocommit=True) as c:
            row = c.execute("select 1 from pg_stat_activity where pid = %s", (self.pid,)).fetchone()
        return row is not None

    def release(self) -> None:
        """End the transaction and close the session; note whether the timeout got there first."""
        if self.conn is None or self.conn.closed:
            return
        try:
            self.conn.rollback()
        except (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout):
            # The server ended the session (idle_in_transaction_session_timeout): already gone.
            self.ended_by_timeout = True
        finally:
            self.conn.close()

    def __enter__(self) -> Holder:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.release()

