"""jobqueue under a production engineer's faults (issue 31, first part): a handler that exits
or commits on its own, the server ending a session mid-job, a statement that keeps failing on a
healthy connection, a busy worker's NOTIFY backlog, names that do not collide, a reaper that
says what it killed, and the operator's enqueue and show."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest
from conftest import HERE, Scratch
from psycopg import sql

from jobqueue import (
    Claim,
    ConfigError,
    Handlers,
    Outcome,
    Reaper,
    ReaperConfig,
    Worker,
    WorkerOptions,
)
from jobqueue import enqueue as put


@pytest.fixture
def conn(scratch: Scratch):
    with scratch.connect("worker", "test hardening", autocommit=True) as c:
        yield c


def _state(conn: psycopg.Connection, job: int) -> tuple[Any, ...]:
    row = conn.execute("select status, attempts, last_error from jobqueue.jobs where id = %s",
                       (job,)).fetchone()
    assert row is not None
    return tuple(row)


def _drain(scratch: Scratch, handlers: Handlers, **kw: Any) -> int:
    options = WorkerOptions(until_empty=True, listen=False, backoff=0, **kw)
    return Worker(scratch.worker, options, handlers).run()


def test_a_handler_that_exits_fails_its_job_and_the_worker_goes_on(scratch: Scratch,
                                                                  conn) -> None:
    def exits(c: psycopg.Connection, job: Claim) -> None:
        sys.exit(0)

    bad = put(conn, "exits", tenant=1, max_attempts=1)
    good = put(conn, "ok", tenant=1)
    assert _drain(scratch, Handlers({"exits": exits, "ok": lambda c, j: None})) == 2
    status, attempts, error = _state(conn, bad)
    assert (status, attempts) == ("dead", 1) and "raised SystemExit(0)" in error
    assert _state(conn, good)[0] == "done"


def test_a_handler_that_commits_fails_its_job_and_says_its_writes_escaped(scratch: Scratch,
                                                                         conn) -> None:
    def commits(c: psycopg.Connection, job: Claim) -> None:
        c.execute("commit")

    job = put(conn, "commits", tenant=1, max_attempts=1)
    _drain(scratch, Handlers({"commits": commits}))
    status, attempts, error = _state(conn, job)
    assert (status, attempts) == ("dead", 1) and "ended the work's transaction" in error


def test_the_server_ending_a_session_mid_job_is_an_outage_not_a_crash(scratch: Scratch,
                                                                      conn) -> None:
    """idle_in_transaction_session_timeout ends the session while the handler works: the
    worker reconnects, and the job runs again once its lease runs out (counted)."""
    with scratch.connect("admin", autocommit=True) as admin:
        admin.execute(sql.SQL("alter role {} in database {} set "
                              "idle_in_transaction_session_timeout = '300ms'").format(
            sql.Identifier(scratch.worker_role), sql.Identifier(scratch.name)))
    seen: list[int] = []

    def slow_first(c: psycopg.Connection, job: Claim) -> None:
        seen.append(job.attempt)
        if job.attempt == 1:
            time.sleep(0.8)  # idle in the work's transaction past the server's timeout

    job = put(conn, "slow", tenant=1)
    options = WorkerOptions(lease=1.0, until_empty=False, listen=False, backoff=0, poll=0.1,
                            max_jobs=1)
    worker = Worker(scratch.worker, options, Handlers({"slow": slow_first}))
    worker.run()  # returns after the job's second attempt; a crash would raise here
    assert seen == [1, 2] and worker.outage.outages == 1
    assert _state(conn, job)[:2] == ("done", 2)


def test_a_session_ended_by_a_server_timeout_reads_as_lost() -> None:
    """The worker above recovers even without this (its transaction's rollback on the closed
    connection raises an OperationalError); where the timeout's own error surfaces, it must read
    as an outage too: 25P03 and 25P04 are InternalError, not OperationalError, in psycopg."""
    from jobqueue import worker as w

    for error in (psycopg.errors.IdleInTransactionSessionTimeout,
                  psycopg.errors.TransactionTimeout, psycopg.errors.AdminShutdown):
        assert issubclass(error, w.LOST), error


def test_a_statement_that_keeps_failing_on_a_healthy_connection_stops_the_worker(
        scratch: Scratch, conn, monkeypatch: pytest.MonkeyPatch) -> None:
    """A grant revoked while running: not "trying again" every second for ever."""
    from jobqueue import worker as w

    monkeypatch.setattr(w.Worker, "_sleep", lambda self, s: None)
    put(conn, "ok", tenant=1)
    with scratch.connect("admin", autocommit=True) as admin:
        admin.execute(sql.SQL("revoke update on jobqueue.jobs from {}").format(
            sql.Identifier(scratch.worker_role)))
    options = WorkerOptions(until_empty=True, listen=False)
    worker = Worker(scratch.worker, options, Handlers({"ok": lambda c, j: None}))
    monkeypatch.setattr(w, "preflight", lambda dsn, name, **kw: None)  # the revoke came later
    with pytest.raises(ConfigError, match=r"failed 3 times in a row.*permission denied"):
        worker.run()


def test_a_busy_worker_keeps_no_notify_backlog(scratch: Scratch, conn) -> None:
    kept: list[int] = []

    def enqueue_more(c: psycopg.Connection, job: Claim) -> None:
        with psycopg.connect(scratch.worker, autocommit=True) as other:
            for _ in range(50):  # 50 NOTIFYs while the worker is busy
                other.execute("select pg_notify('jobqueue', '')")

    for _ in range(5):
        put(conn, "busy", tenant=1)
    options = WorkerOptions(until_empty=True, listen=True, backoff=0)
    worker = Worker(scratch.worker, options, Handlers({"busy": enqueue_more}))
    original = worker.run_round

    def round_and_count(c: psycopg.Connection, pending: list[Claim]) -> Any:
        kept.append(len(c._notifies_backlog) if hasattr(c, "_notifies_backlog") else 0)
        return original(c, pending)

    worker.run_round = round_and_count  # type: ignore[method-assign]
    assert worker.run() == 5
    assert max(kept) < 50, f"NOTIFYs kept while busy: {kept}"


def test_default_worker_names_do_not_collide_across_hosts_or_containers(scratch: Scratch) -> None:
    a = Worker(scratch.worker, WorkerOptions(), Handlers({"x": lambda c, j: None}))
    b = Worker(scratch.worker, WorkerOptions(), Handlers({"x": lambda c, j: None}))
    assert a.name != b.name and a.name.startswith("worker-")


def test_the_reaper_logs_the_jobs_it_marks_dead(scratch: Scratch, conn,
                                               caplog: pytest.LogCaptureFixture) -> None:
    job = put(conn, "lost", tenant=1, max_attempts=1)
    conn.execute("update jobqueue.jobs set status = 'running', attempts = 1, "
                 "locked_until = clock_timestamp() - interval '1 hour' where id = %s", (job,))
    with caplog.at_level(logging.WARNING, logger="jobqueue"):
        assert [r["id"] for r in Reaper(conn, ReaperConfig(grace=0)).run_once()] == [job]
    dead = [r for r in caplog.records if r.levelno == logging.ERROR and f"job {job}" in
            r.getMessage()]
    assert dead and "dead" in dead[0].getMessage()


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobqueue", *argv], capture_output=True,
                          text=True, timeout=60, cwd=HERE)


def test_enqueue_keeps_a_tenant_id_that_is_not_a_plain_number(scratch: Scratch, conn) -> None:
    """``--tenant 007`` is another tenant than 7 on a text install: never turned into 7."""
    from jobqueue.cli import tenant_arg

    assert [tenant_arg(t) for t in ("7", "-3", "007", "acme", "-07")] == \
        [7, -3, "007", "acme", "-07"]
    done = _cli("enqueue", "k", "--tenant", "7", "--dsn", scratch.worker)
    assert done.returncode == 0, done.stderr
    assert conn.execute("select tenant_id from jobqueue.jobs where id = %s",
                        (int(done.stdout),)).fetchone() == (7,)


def test_show_prints_a_big_payload_shortened(scratch: Scratch, conn) -> None:
    job = put(conn, "big", tenant=1, payload={"blob": "x" * 100_000})
    done = _cli("show", str(job), "--dsn", scratch.worker)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) < 5_000 and "--json shows it whole" in done.stdout


def test_jobs_claimed_with_a_finish_are_let_go_when_the_server_goes_before_they_run(
        scratch: Scratch, conn, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server restart right after a finish that claimed the next job (before it ran): the
    worker reconnects, and that job is let go, its lease runs out and it runs (counted). Before,
    the heartbeat (its own session, back with the server) kept extending its lease for ever:
    `running` for no one (seen in test_jobqueue_restart under load, 1 of 4 runs)."""
    from jobqueue import Hooks
    from jobqueue.heartbeat import Presence

    monkeypatch.setattr(Presence, "due", lambda self: True)  # a worker row written every round
    first, second = put(conn, "ok", tenant=1), put(conn, "ok", tenant=1)
    admin = scratch.connect("admin", autocommit=True)

    class CutAfterFirst(Hooks):
        def after_finish(self, claim: Claim, outcome: Outcome) -> None:
            if claim.id == first:  # committed, with the next job claimed: the server goes
                admin.execute("select pg_terminate_backend(pid) from pg_stat_activity "
                              "where application_name = 'jobqueue cut'")

    options = WorkerOptions(lease=1.0, until_empty=False, listen=False, backoff=0, poll=0.1,
                            max_jobs=2, name="cut", batch=1)
    worker = Worker(scratch.worker, options, Handlers({"ok": lambda c, job: None}),
                    hooks=CutAfterFirst())
    runner = threading.Thread(target=worker.run, daemon=True)
    try:
        runner.start()
        runner.join(timeout=30)
        assert not runner.is_alive(), f"job {second} never ran again: {_state(conn, second)}"
    finally:
        worker.stop()
        runner.join(timeout=10)
        admin.close()
    assert worker.outage.outages == 1
    assert _state(conn, first)[:2] == ("done", 1)
    assert _state(conn, second)[:2] == ("done", 2)
