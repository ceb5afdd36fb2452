"""Finding ``vacuum``: what a long job's open transaction holds back from VACUUM.

Per variant, one long job runs while a second worker handles many short jobs (each a claim
``for update skip locked`` and an update in one transaction: one dead row version per job).
When the short jobs are done, with the long job still running, ``VACUUM (VERBOSE) jobs`` (as
admin) reports how many dead row versions it removed and how many were "dead but not yet
removable": those a transaction older than their death might still see. The variants differ
only in what the long job keeps open; the article's verdict: a transaction that wrote (and a
row lock is a write) or that keeps a snapshot (REPEATABLE READ) holds VACUUM back; a lease
whose long work runs outside a transaction, or a READ COMMITTED reader idle between
statements, holds nothing.

Two more variants run the worker the kit exports, ``python -m jobqueue worker``, as a
child process logging in as the worker role, with its defaults and one job: its handler reads
(counts the tenant's invoices) or writes (one row), then sleeps. While it sleeps, an update of
every row of an unrelated table (``churn``) leaves one dead row version each, and ``VACUUM
(VERBOSE) churn`` counts them; after the job's finish, a second VACUUM shows what was left.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jobqueue
import pandas as pd
import psycopg
from psycopg.rows import dict_row

from .. import db, finding, kinds, queue
from ..errors import TenantlabError
from ..finding import Result, Verdict, check, knob, plain
from ..monitor import Monitor
from ..queries import q
from ._vacuum_handlers import STATEMENT

log = logging.getLogger("tenantlab")

CLAIM = ("A long job holds VACUUM back when its open transaction wrote something (SELECT ... "
         "FOR UPDATE counts) or keeps a REPEATABLE READ snapshot; a lease with the long work "
         "outside a transaction, or a READ COMMITTED reader idle between statements, holds "
         "nothing; throughput barely shows it (6.6 s vs 5.5-5.6 s for 5,000 jobs). The worker "
         "the kit exports holds nothing while a handler only reads; a handler that writes holds "
         "the horizon from its first write until its finish commits.")
ARTICLE = {
    "long_job_seconds": 20, "short_jobs": 5000,
    "holds_back": ["single transaction FOR UPDATE", "long transaction that wrote"],
    "holds_nothing": ["lease, long work outside a transaction",
                      "read-only READ COMMITTED, idle between statements"],
    "short_jobs_seconds": {"held": 6.6, "not held": [5.5, 5.6]},
}

_TUPLES = re.compile(r"tuples: (\d+) removed, (\d+) remain, (\d+) are dead but not yet removable")
_CUTOFF = re.compile(r"removable cutoff: (\d+), which was (\d+) XIDs old")


@dataclass(frozen=True)
class Variant:
    """What the long job keeps open while the short jobs run, and what the article expects.

    ``kind``: the job kind the exported worker runs (``_vacuum_handlers``); None for the lab's
    own long job, run in a thread.
    """

    name: str
    label: str
    holds_back: bool
    kind: str | None = None


# Labels differ in their first words: a chart's axis may cut the end of a long one.
VARIANTS = (
    Variant("single_for_update", "single transaction (FOR UPDATE)", True),
    Variant("leased_outside", "lease, work outside a transaction", False),
    Variant("leased_wrote", "lease, work in a transaction that wrote", True),
    Variant("read_committed_idle", "READ COMMITTED reader, idle", False),
    Variant("repeatable_read", "REPEATABLE READ reader", True),
    Variant("jobqueue_reads", "exported worker, handler reads", False, "read_then_sleep"),
    Variant("jobqueue_writes", "exported worker, handler writes", True, "write_then_sleep"),
)
BY_NAME = {v.name: v for v in VARIANTS}
#: The exported worker's handlers module, and the tenant its one job runs for.
HANDLERS = "tenantlab.experiments._vacuum_handlers"
TENANT = 1


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """One long job of `long_seconds` per variant, `short_jobs` short jobs beside it.

    The exported worker's jobs sleep `handler_seconds` (they need only outlast one VACUUM) and
    run beside no short jobs: `short_jobs` rows of churn die instead.
    """

    long_seconds: float = knob(4.0, full=20.0, lo=0.5, hi=20.0, step=0.5, label="long job (s)")
    handler_seconds: float = knob(2.0, full=20.0, lo=0.5, hi=20.0, step=0.5,
                                  label="exported worker's job (s)")
    short_jobs: int = knob(2000, full=5000, lo=100, hi=5000, step=100, label="short jobs")
    variants: tuple[str, ...] = knob(tuple(BY_NAME))


class VacuumError(TenantlabError, RuntimeError):
    """The vacuum experiment could not run as planned."""


def parse_verbose(messages: list[str]) -> dict[str, int]:
    """Return removed / remaining / dead-but-not-removable tuples from VACUUM VERBOSE output."""
    text = "\n".join(messages)
    m = _TUPLES.search(text)
    if m is None:
        raise VacuumError(f"no tuples line in the VACUUM VERBOSE output: {text[:300]!r}")
    out = {"removable": int(m[1]), "remain": int(m[2]), "dead_not_removable": int(m[3])}
    if c := _CUTOFF.search(text):
        out["cutoff_xids_old"] = int(c[2])
    return out


def vacuum_verbose(dsn: str, query: str = "vacuum_verbose_jobs") -> dict[str, int]:
    """Run VACUUM (VERBOSE) of a table as admin; return what it removed and what it could not."""
    messages: list[str] = []
    with db.connect(dsn, "vacuum", autocommit=True) as conn:
        conn.add_notice_handler(lambda d: messages.append(d.message_primary or ""))
        conn.execute(q(query))
    return parse_verbose(messages)


class LongJob(threading.Thread):
    """Run one variant's long job with the queue designs, on its own connection, in a thread.

    It opens what the variant keeps open, sets ``holding``, then stays until its time is up
    *and* the VACUUM has run (so VACUUM always sees it), or until ``stop`` is set.
    """

    def __init__(self, dsn: str, variant: Variant, seconds: float) -> None:
        super().__init__(name=f"tenantlab-long-{variant.name}", daemon=True)
        self.dsn, self.variant, self.seconds = dsn, variant, seconds
        self.holding, self.vacuumed = threading.Event(), threading.Event()
        self.stop = threading.Event()
        self.lease = queue.Leased(lease=seconds + 60)
        self.pid: int | None = None
        self.error: BaseException | None = None

    def hold(self, *_: Any) -> None:
        """Do the long work: wait, but wake up at once when the experiment is interrupted."""
        self.holding.set()
        deadline = time.monotonic() + self.seconds
        while not self.stop.is_set():
            if time.monotonic() >= deadline and self.vacuumed.is_set():
                return
            self.stop.wait(0.05)

    def run(self) -> None:
        try:
            with db.connect(self.dsn, f"long job {self.variant.name}", autocommit=True) as conn:
                self.pid = conn.info.backend_pid
                getattr(self, f"_{self.variant.name}")(conn)
        except BaseException as e:  # handed to the main thread
            self.error = e
        finally:
            self.holding.set()

    def _claim(self, conn: psycopg.Connection) -> queue.Claim:
        claim = self.lease.claim(conn)  # committed: the claim itself keeps nothing open
        if claim is None:
            raise VacuumError("no long job to claim")
        return claim

    def _single_for_update(self, conn: psycopg.Connection) -> None:
        # Claim (FOR UPDATE), long work and finish in one transaction.
        queue.SingleTransaction().run_one(conn, self.hold, worker="long")

    def _leased_outside(self, conn: psycopg.Connection) -> None:
        claim = self._claim(conn)
        self.hold()
        self.lease.execute(conn, claim, kinds.noop, worker="long")

    def _leased_wrote(self, conn: psycopg.Connection) -> None:
        # The work writes a row first (a demo job with "write": true), then works for long.
        def work(conn: psycopg.Connection, claim: queue.Claim) -> None:
            kinds.write_first(conn, claim)
            self.hold()

        self.lease.execute(conn, self._claim(conn), work, worker="long")

    def _read_only(self, conn: psycopg.Connection, level: psycopg.IsolationLevel) -> None:
        claim = self._claim(conn)
        conn.isolation_level = level
        with conn.transaction():
            conn.execute(q("holder_read_jobs"))
            self.hold()
            conn.execute(q("holder_read_jobs"))
        conn.isolation_level = None
        self.lease.execute(conn, claim, kinds.noop, worker="long")

    def _read_committed_idle(self, conn: psycopg.Connection) -> None:
        self._read_only(conn, psycopg.IsolationLevel.READ_COMMITTED)

    def _repeatable_read(self, conn: psycopg.Connection) -> None:
        self._read_only(conn, psycopg.IsolationLevel.REPEATABLE_READ)


def short_jobs(conn: psycopg.Connection, limit: int) -> int:
    """Run queued jobs with the single-transaction design until none is left; return how many."""
    design = queue.SingleTransaction()
    done = 0
    while done < limit and design.run_one(conn, kinds.noop, worker="short") is not None:
        done += 1
    return done


def run_variant(s: db.Scratch, variant: Variant, long_seconds: float, n_short: int,
                monitor: Monitor, watch: Callable[[dict], None] | None = None
                ) -> dict[str, Any]:
    """Run one variant in scratch database s; return its row.

    watch gets ``{"phase": "holding", ...}`` once the long job holds (an interrupt raised
    there must still end it), then the row with ``"phase": "done"``.
    """
    if variant.kind is not None:
        return run_exported(s, variant, long_seconds, n_short, monitor, watch)
    with s.connect("admin", "vacuum setup", autocommit=True) as admin:
        admin.execute(q("reset_queue"))
        # The long job first: both designs claim the oldest job.
        queue.enqueue(admin, "sleep", seconds=long_seconds,
                      write=variant.name == "leased_wrote")
        queue.enqueue(admin, "noop", count=n_short)
        admin.execute(q("horizon_vacuum_analyze_jobs"))
    long = LongJob(s.worker, variant, long_seconds)
    long.start()
    try:
        long.holding.wait(30)
        if long.error is not None:
            raise VacuumError(f"long job {variant.name} failed: {long.error}") from long.error
        if watch is not None:
            watch({"variant": variant.name, "phase": "holding", "long_job_pid": long.pid})
        with s.connect("worker", "short jobs", autocommit=True) as conn:
            t0 = time.perf_counter()
            handled = short_jobs(conn, n_short)
            seconds = time.perf_counter() - t0
        sample = monitor.sample()
        mine = sample.holders[sample.holders["pid"] == long.pid]
        if not long.is_alive():
            raise VacuumError(f"long job {variant.name} ended before VACUUM: {long.error}")
        result = vacuum_verbose(s.admin)
        long.vacuumed.set()
        long.join(long_seconds + 30)
        if long.error is not None:
            raise VacuumError(f"long job {variant.name} failed: {long.error}") from long.error
    finally:
        # Interrupted or not: the long job ends (and its connection rolls back) before we go on.
        long.stop.set()
        long.join(30)
    held_by = "nothing"
    if not mine.empty:  # missing values come back as NaN, which is true: test with notna
        held_by = _held_by(mine.iloc[0]["backend_xid"], mine.iloc[0]["backend_xmin"])
    row = {
        "variant": variant.name, "label": variant.label, "expected_holds_back": variant.holds_back,
        "holds_back": result["dead_not_removable"] > 0, "long_job_holds": held_by,
        "removable": result["removable"], "dead_not_removable": result["dead_not_removable"],
        "remain": result["remain"], "short_jobs": handled, "seconds": round(seconds, 3),
        "foreign_holders": len(sample.foreign(s.name)),
    }
    if watch is not None:
        watch(dict(row, phase="done"))
    return row


def _held_by(xid: Any, xmin: Any) -> str:
    return "xid" if pd.notna(xid) else "snapshot" if pd.notna(xmin) else "nothing"


def worker_argv(name: str) -> list[str]:
    """Return the exported worker's command line: its defaults, this experiment's handlers, one job."""
    return [sys.executable, "-m", "jobqueue", "worker", "--handlers", HANDLERS,
            "--name", name, "--max-jobs", "1"]


@contextmanager
def exported_worker(s: db.Scratch, name: str) -> Iterator[subprocess.Popen]:
    """Start the exported worker as the worker role; when this ends, so has the process.

    A worker still running then (an error, an interrupt) is killed, not asked to stop: asked, it
    would finish its job first. Its session ends with its socket; the job's transaction rolls back.
    """
    with subprocess.Popen(worker_argv(name), env=dict(os.environ, JOBQUEUE_DSN=s.worker),
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def _session(admin: psycopg.Connection, app: str) -> dict[str, Any] | None:
    with admin.cursor(row_factory=dict_row) as cur:
        return cur.execute(q("vacuum_worker_session"), {"app": app}).fetchone()


def as_sent(query: str) -> str:
    """Return a named query as pg_stat_activity shows it: psycopg sends %(name)s as $1, $2..."""
    seen: dict[str, int] = {}
    sent = re.sub(r"%\((\w+)\)s", lambda m: f"${seen.setdefault(m[1], len(seen) + 1)}", query)
    return sent.replace("%%", "%").strip().rstrip(";")


def _sleeping(admin: psycopg.Connection, proc: subprocess.Popen, app: str, statement: str,
              timeout: float = 30.0) -> dict[str, Any]:
    """Wait until the worker's session sits in the job's transaction after the handler's statement.

    Then the handler sleeps: whatever its transaction holds, it holds until the finish.
    """
    # The handler's statement up to its first parameter: jobqueue runs handlers with
    # client-side binding, so pg_stat_activity shows the values where $1, $2 would be.
    want = as_sent(q(statement)).split("$", 1)[0]
    deadline = time.monotonic() + timeout
    while True:
        row = _session(admin, app)
        if (row is not None and row["state"] == "idle in transaction"
                and (row["query"] or "").strip().startswith(want)):
            return row
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise VacuumError(f"the exported worker exited ({proc.returncode}) before its job "
                              f"slept: {(err or '').strip()[-500:]}")
        if time.monotonic() > deadline:
            raise VacuumError(f"the exported worker's job did not reach its sleep within "
                              f"{timeout:g} s (session: {row})")
        time.sleep(0.02)


def run_exported(s: db.Scratch, variant: Variant, seconds: float, n_dead: int, monitor: Monitor,
                 watch: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Run one job of the variant's kind in the exported worker; VACUUM churn while it sleeps.

    The worker (``--max-jobs 1``) runs the job and exits; VACUUM runs once while the handler
    sleeps, once after the finish has committed. watch: as in ``run_variant``.
    """
    assert variant.kind is not None
    name = f"vacuum-{variant.name}"
    app = f"{jobqueue.__name__} {name}"  # the worker's session names itself so
    with s.connect("admin", "vacuum setup", autocommit=True) as admin:
        admin.execute(q("reset_queue"))
        admin.execute(q("vacuum_create_churn"))
        admin.execute(q("vacuum_churn_fill"), {"n": n_dead})
        job = jobqueue.enqueue(admin, variant.kind, tenant=TENANT, payload={"seconds": seconds})
        with exported_worker(s, name) as proc:
            sleeping = _sleeping(admin, proc, app, STATEMENT[variant.kind])
            if watch is not None:
                watch({"variant": variant.name, "phase": "holding",
                       "long_job_pid": sleeping["pid"], "worker_pid": proc.pid})
            # Dead rows in a table the job never touches, made and committed after its start.
            admin.execute(q("vacuum_churn_update"))
            sample = monitor.sample()
            during = vacuum_verbose(s.admin, "vacuum_verbose_churn")
            seen = _session(admin, app)
            # The same statement, the same state since: the handler was asleep all along.
            if seen is None or seen["state_change"] != sleeping["state_change"]:
                raise VacuumError(f"the exported worker's {variant.kind} job ended before VACUUM "
                                  f"ran: give it more than {seconds:g} s")
            try:
                _, err = proc.communicate(timeout=seconds + 30)
            except subprocess.TimeoutExpired:
                raise VacuumError("the exported worker did not exit after its one job") from None
            if proc.returncode != 0:
                raise VacuumError(f"the exported worker exited {proc.returncode}: "
                                  f"{(err or '').strip()[-500:]}")
        row = admin.execute(q("vacuum_job_status"), {"id": job}).fetchone()
    after = vacuum_verbose(s.admin, "vacuum_verbose_churn")
    out = {
        "variant": variant.name, "label": variant.label,
        "expected_holds_back": variant.holds_back,
        "holds_back": during["dead_not_removable"] > 0,
        "long_job_holds": _held_by(seen["backend_xid"], seen["backend_xmin"]),
        "removable": during["removable"], "dead_not_removable": during["dead_not_removable"],
        "remain": during["remain"], "short_jobs": None, "seconds": None,
        "foreign_holders": len(sample.foreign(s.name)),
        "dead_rows": n_dead, "held_after_finish": after["dead_not_removable"],
        "job": row[0] if row else "missing",
    }
    if watch is not None:
        watch(dict(out, phase="done"))
    return out


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None,
        watch: Callable[[dict], None] | None = None) -> Result:
    """Run the variants in one scratch database; return their rows and the verdict.

    ``live`` (a ``LiveChart``) is redrawn and ``progress(1)`` called as each variant ends;
    ``watch`` gets each variant's phases (``"holding"``, ``"done"``; see ``run_variant``).
    """
    k = knobs or Knobs.sized()
    unknown = [n for n in k.variants if n not in BY_NAME]
    if unknown or not k.variants:
        raise VacuumError(f"unknown variant {', '.join(unknown) or '(none)'}; "
                          f"valid: {', '.join(BY_NAME)}")
    if k.short_jobs < 1 or k.long_seconds <= 0 or k.handler_seconds <= 0:
        raise VacuumError("short_jobs must be at least 1, long_seconds and handler_seconds "
                          "above 0")
    rows: list[dict[str, Any]] = []
    with db.scratch("vacuum") as s, Monitor(s.admin) as monitor:
        for name in k.variants:
            v = BY_NAME[name]
            seconds = k.long_seconds if v.kind is None else k.handler_seconds
            rows.append(run_variant(s, v, seconds, k.short_jobs, monitor, watch))
            if live is not None:
                live.update(pd.DataFrame(rows))
            if progress is not None:
                progress(1)
    df = pd.DataFrame(rows)
    measured = _measured(df, k)
    return Result("vacuum", k, measured, judge(measured, k),
                  table=df)


def _measured(df: pd.DataFrame, k: Knobs) -> dict[str, Any]:
    measured: dict[str, Any] = {}
    for r in df.to_dict("records"):
        m = {"removable": r["removable"], "dead_not_removable": r["dead_not_removable"],
             "long_job_holds": r["long_job_holds"]}
        if BY_NAME[r["variant"]].kind is None:
            m["seconds"] = r["seconds"]
        else:
            # A column the lab's variants lack comes back as float (NaN there): whole again.
            m |= {"dead_rows": int(r["dead_rows"]),
                  "held_after_finish": int(r["held_after_finish"]), "job": r["job"]}
        measured[r["variant"]] = m
    lab = df[df["variant"].map(lambda n: BY_NAME[n].kind is None)]
    held = lab[lab["expected_holds_back"]]["seconds"]
    free = lab[~lab["expected_holds_back"]]["seconds"]
    measured["short_jobs"] = k.short_jobs
    measured["long_seconds"] = k.long_seconds
    measured["handler_seconds"] = k.handler_seconds
    # One variant alone (the explorer) has nothing to compare with.
    measured["seconds_ratio_held_vs_not"] = (
        round(float(held.mean() / free.mean()), 2) if len(held) and len(free) else None)
    measured["not_as_article"] = df[df["holds_back"] != df["expected_holds_back"]][
        "variant"].tolist()
    return plain(measured)


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Judge each variant that ran: does it hold VACUUM back exactly when the article says?

    The exported worker's: a handler that reads holds none of the dead rows; one that writes
    holds every one of them until its finish commits, then none; both jobs end done.
    """
    k = knobs or Knobs()
    checks = []
    for v in VARIANTS:
        if (m := measured.get(v.name)) is None:
            continue
        if v.kind is not None:
            checks.append(_exported_check(v, m))
            continue
        held = m["dead_not_removable"] > 0
        checks.append(check(
            v.label, held == v.holds_back,
            "holds VACUUM back" if v.holds_back else "holds nothing back",
            f"{'holds back' if held else 'holds nothing'}: {m['dead_not_removable']:,} dead "
            f"not yet removable, {m['removable']:,} removed"))
    return Verdict.of(checks, article=k.is_article_setup())


def _exported_check(v: Variant, m: dict[str, Any]) -> finding.Check:
    n, held, after = m["dead_rows"], m["dead_not_removable"], m["held_after_finish"]
    measured = (f"{held:,} of {n:,} dead rows not yet removable while it ran, {after:,} after "
                f"its finish; job {m['job']}")
    if v.holds_back:
        return check(v.label, held == n and after == 0 and m["job"] == "done",
                     f"holds all {n:,} dead rows until its finish commits, then none", measured)
    return check(v.label, held == 0 and m["job"] == "done",
                 f"holds none of the {n:,} dead rows", measured)
