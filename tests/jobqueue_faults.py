"""Run the fault matrix against a jobqueue package: one handler's server error fails only its job.

Usage: ``python tests/jobqueue_faults.py --package NAME --dsn DSN [--json]``

``NAME`` is the queue package to import (``jobqueue``, or an exported copy such as
``shop``); ``DSN`` is the worker's ordinary role on a database where that package's migrations
were applied (tables in the ``jobqueue`` schema). The script imports only the standard library,
psycopg and that package, so it runs from a venv holding nothing else.

For every cell of {statement timeout, lock timeout, deadlock, serialization failure, connection
killed} x {one job, ``--batch 5``, ``--batch 5 --batch-commit``} it enqueues 5 jobs for 5
tenants, the middle one of which hits the fault inside its transaction on its first attempt
only, runs a ``Worker`` in a thread until every job is final, and checks:

- an error cell: the faulty job's first attempt is counted and its error, named, is in
  ``jobqueue.jobs.last_error`` when it is retried (its retry reads it); it ends done after 2
  attempts; the 4 healthy jobs end done, 1 attempt and 1 execution each; the worker never took
  the error for a lost server (``worker.outage.outages == 0``, nothing logged as such);
- the killed cell: the job is not lost (its lease expires, it is retried and ends done), the
  worker reconnected (outages >= 1) and did not exit; the healthy jobs end done, executed
  once, or at most twice with ``--batch-commit``: a lost connection loses the batch's
  uncommitted finishes, and those jobs run again (documented, counted).

Executions are counted outside the database (one JSON line per execution in a file), so a
rolled-back execution is counted too. Exit status: 0 every cell passed, 1 some cell failed,
2 bad usage (the package cannot be imported).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg

LEASE = 2.0  # seconds: short, so a killed connection's job is retried within the run
# Tenants the lab seeds too: its jobs table references its tenants (1..100).
TENANTS = (11, 12, 13, 14, 15)
FAULTY = 2  # the middle job
LOCK_KEY = 0x6A0B_F417  # the advisory lock the lock-timeout cell holds on another session
MODES: dict[str, dict[str, Any]] = {
    "one-job": {"batch": 1, "batch_commit": False},
    "batch": {"batch": 5, "batch_commit": False},
    "batch-commit": {"batch": 5, "batch_commit": True},
}


def _statement_timeout(conn: psycopg.Connection) -> None:
    conn.execute("set local statement_timeout = '100ms'")
    conn.execute("select pg_sleep(2)")


def _lock_timeout(conn: psycopg.Connection) -> None:
    # Another session of this script holds the lock for the whole cell (see run_cell).
    conn.execute("set local lock_timeout = '100ms'")
    conn.execute("select pg_advisory_xact_lock(%s)", (LOCK_KEY,))


# A real deadlock needs two sessions, and which one the server picks as the victim depends on
# whose deadlock_timeout runs out first; setting deadlock_timeout is for superusers only, so an
# ordinary worker role cannot make the handler's session the one that fails. The server raises
# the same error with the same SQLSTATE here, and psycopg maps it to the same class
# (DeadlockDetected, SerializationFailure): that is all the worker's classification can see.
def _deadlock(conn: psycopg.Connection) -> None:
    conn.execute("do $$ begin raise exception 'deadlock detected (simulated)' "
                 "using errcode = '40P01'; end $$")


def _serialization_failure(conn: psycopg.Connection) -> None:
    conn.execute("do $$ begin raise exception 'could not serialize access (simulated)' "
                 "using errcode = '40001'; end $$")


def _killed(conn: psycopg.Connection) -> None:
    conn.execute("select pg_terminate_backend(pg_backend_pid())")


@dataclass(frozen=True)
class Fault:
    name: str
    cause: Any  # callable(conn): produces the fault on the handler's connection
    #: what last_error must contain to name the real error (the class, or the server's words)
    names: tuple[str, ...] = ()
    kills: bool = False


FAULTS = {f.name: f for f in (
    Fault("statement-timeout", _statement_timeout, ("QueryCanceled", "statement timeout")),
    Fault("lock-timeout", _lock_timeout, ("LockNotAvailable", "lock timeout")),
    Fault("deadlock", _deadlock, ("DeadlockDetected", "40P01")),
    Fault("serialization-failure", _serialization_failure, ("SerializationFailure", "40001")),
    Fault("killed", _killed, kills=True),
)}
CELLS = [(f, m) for f in FAULTS for m in MODES]


@dataclass
class Job:
    id: int
    tenant: int
    faulty: bool
    status: str = "?"
    attempts: int = 0
    executions: int = 0
    #: jobs.last_error as each execution saw it when it started (the retry sees the failure's)
    errors_seen: list[str | None] = field(default_factory=list)


@dataclass
class Cell:
    fault: str
    mode: str
    seconds: float = 0.0
    outages: int = 0
    lost_server_logged: list[str] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def explain(self) -> str:
        """Say what the cell saw, problems first."""
        lines = [f"{self.fault} x {self.mode}: " + ("ok" if self.ok else "FAILED")]
        lines += [f"  - {p}" for p in self.problems]
        for j in self.jobs:
            lines.append(f"    job {j.id} tenant {j.tenant}{' (faulty)' if j.faulty else ''}: "
                         f"{j.status}, attempts {j.attempts}, executions {j.executions}, "
                         f"last_error seen {j.errors_seen}")
        lines.append(f"    outages {self.outages}, {self.seconds:.1f} s")
        return "\n".join(lines)


class _Recorder(logging.Handler):
    """Keep the package's log lines that say the server was lost."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "lost the server" in text:
            self.lines.append(text)


def _handler(fault: Fault, journal: Path):
    def handle(conn: psycopg.Connection, job: Any) -> None:
        # Read before anything else: on the retry, the first attempt's recorded error.
        row = conn.execute("select last_error from jobqueue.jobs where id = %s",
                           (job.id,)).fetchone()
        with journal.open("a") as f:
            f.write(json.dumps({"job": job.id, "attempt": job.attempt,
                                "last_error": row[0] if row else None}) + "\n")
        if job.payload.get("fault") and job.attempt == 1:
            fault.cause(conn)
    return handle


def run_cell(pkg: ModuleType, dsn: str, fault_name: str, mode: str, *,
             deadline: float = 30.0) -> Cell:
    """Run one cell of the matrix against package `pkg`; return what it saw and its problems."""
    fault, options = FAULTS[fault_name], MODES[mode]
    cell = Cell(fault_name, mode)
    kind = f"faults.{fault_name}.{mode}"
    started = time.monotonic()
    recorder = _Recorder()
    logger = logging.getLogger(pkg.__name__.split(".")[0])
    with tempfile.TemporaryDirectory(prefix="jobqueue-faults-") as tmp, \
            psycopg.connect(dsn, autocommit=True, application_name="jobqueue faults") as look:
        journal = Path(tmp) / "executions.jsonl"
        journal.touch()
        look.execute("delete from jobqueue.jobs where kind = %s", (kind,))
        with look.transaction():
            ids = [pkg.enqueue(look, kind, tenant=t,
                               payload={"fault": fault_name if i == FAULTY else None})
                   for i, t in enumerate(TENANTS)]
        cell.jobs = [Job(id=i, tenant=t, faulty=n == FAULTY)
                     for n, (i, t) in enumerate(zip(ids, TENANTS, strict=True))]
        holder = None
        if fault_name == "lock-timeout":
            holder = psycopg.connect(dsn, autocommit=True, application_name="jobqueue faults lock")
            holder.execute("select pg_advisory_lock(%s)", (LOCK_KEY,))
        worker = pkg.Worker(dsn, pkg.WorkerOptions(lease=LEASE, backoff=0, poll=0.1,
                                                   name=f"faults-{fault_name}-{mode}", **options),
                            pkg.Handlers({kind: _handler(fault, journal)}))
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["claimed"] = worker.run()
            except BaseException as e:  # noqa: B036 - reported as the cell's problem
                box["error"] = e

        logger.addHandler(recorder)
        thread = threading.Thread(target=run, name=f"faults {fault_name} {mode}", daemon=True)
        try:
            thread.start()
            end = time.monotonic() + deadline
            while time.monotonic() < end and thread.is_alive():
                left = look.execute("select count(*) from jobqueue.jobs where kind = %s "
                                    "and status not in ('done', 'dead')", (kind,)).fetchone()
                if left and left[0] == 0:
                    break
                time.sleep(0.1)
            else:
                if thread.is_alive():
                    cell.problems.append(f"jobs still not final after {deadline:g} s")
            if not thread.is_alive():
                cell.problems.append("the worker exited before it was stopped")
            worker.stop()
            thread.join(timeout=5 * LEASE + 10)
            if thread.is_alive():
                cell.problems.append("the worker did not stop when asked")
        finally:
            logger.removeHandler(recorder)
            if holder is not None:
                holder.close()
        if "error" in box:
            cell.problems.append(f"worker.run raised {type(box['error']).__name__}: {box['error']}")
        cell.outages = worker.outage.outages
        cell.lost_server_logged = recorder.lines
        rows = {r[0]: r[1:] for r in look.execute(
            "select id, status, attempts from jobqueue.jobs where kind = %s", (kind,))}
        for j in cell.jobs:
            j.status, j.attempts = rows.get(j.id, ("missing", 0))
        by_id = {j.id: j for j in cell.jobs}
        for line in journal.read_text().splitlines():
            seen = json.loads(line)
            by_id[seen["job"]].executions += 1
            by_id[seen["job"]].errors_seen.append(seen["last_error"])
    cell.seconds = time.monotonic() - started
    cell.problems += _judge(cell, fault)
    return cell


def _judge(cell: Cell, fault: Fault) -> list[str]:
    """Return what this cell's outcome violates (empty: the cell passed)."""
    problems = []
    for j in cell.jobs:
        who = f"job {j.id} ({'faulty' if j.faulty else 'healthy'}, tenant {j.tenant})"
        if j.status != "done":
            problems.append(f"{who} ended {j.status}, not done")
        if j.faulty:
            if j.executions != 2:
                problems.append(f"{who} ran {j.executions} times, not 2 (the faulty attempt, "
                                "then one retry)")
            if not fault.kills:
                if j.attempts != 2:
                    problems.append(f"{who} has attempts {j.attempts}, not 2 (its failed attempt "
                                    "counted, then one retry)")
                recorded = j.errors_seen[1] if len(j.errors_seen) > 1 else None
                if not recorded or not any(n in recorded for n in fault.names):
                    problems.append(f"{who}'s error was not recorded: at its retry last_error was "
                                    f"{recorded!r}, which does not name {' or '.join(fault.names)}")
            continue
        # A killed batch-commit connection loses the batch's uncommitted finishes: those jobs
        # run again (their attempts were counted at the claim). Nothing else may run twice.
        most = 2 if fault.kills and cell.mode == "batch-commit" else 1
        if not 1 <= j.executions <= most:
            problems.append(f"{who} ran {j.executions} times, expected "
                            f"{'1 or 2' if most == 2 else 'exactly 1'}")
        # A killed --batch leaves the jobs it claimed and had not run yet to a second claim.
        if j.attempts > (2 if fault.kills else 1):
            problems.append(f"{who} has attempts {j.attempts}, expected "
                            f"{'at most 2' if fault.kills else '1'}")
    if fault.kills:
        if cell.outages < 1:
            problems.append("the killed connection was not treated as a lost server (0 outages)")
    elif cell.outages or cell.lost_server_logged:
        problems.append(f"the worker took a {cell.fault} for a lost server ({cell.outages} "
                        f"outages; logged: {cell.lost_server_logged})")
    return problems


def run_matrix(pkg: ModuleType, dsn: str,
               cells: list[tuple[str, str]] | None = None) -> list[Cell]:
    """Run the given cells (default: all 15), one after another."""
    return [run_cell(pkg, dsn, f, m) for f, m in (cells or CELLS)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", required=True,
                   help="the queue package to test: jobqueue or an exported copy")
    p.add_argument("--dsn", required=True, help="the worker role's DSN (migrations applied)")
    p.add_argument("--json", action="store_true", help="print the cells as JSON")
    args = p.parse_args(argv)
    try:
        pkg = importlib.import_module(args.package)
    except ImportError as e:
        print(f"cannot import the queue package {args.package!r}: {e}", file=sys.stderr)
        return 2
    cells = run_matrix(pkg, args.dsn)
    if args.json:
        print(json.dumps({"package": args.package, "ok": all(c.ok for c in cells),
                          "cells": [asdict(c) | {"ok": c.ok} for c in cells]}, indent=1))
    else:
        for c in cells:
            print(c.explain() if not c.ok else
                  f"{c.fault} x {c.mode}: ok ({c.seconds:.1f} s, outages {c.outages})")
        print(f"{sum(c.ok for c in cells)}/{len(cells)} cells passed")
    return 0 if all(c.ok for c in cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
