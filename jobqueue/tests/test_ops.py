"""jobqueue for the people who run it: logs, every attempt kept, stats/jobs/show/retry/cancel.

One worker process per log format (the logs are what an operator reads: stderr, no -v); the
rest in process on one scratch database each: job_runs rows per attempt, the --json shapes,
retry of a dead job, cancel of a queued and of a running job (the handler sees it, its finish
is fenced out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Scratch
from psycopg import sql

from jobqueue import Claim, Leased, enqueue, ops
from jobqueue import cli as jq_cli
from jobqueue.heartbeat import Presence

PROG = [sys.executable, "-m", "jobqueue"]
ROOT = Path(__file__).resolve().parent

HANDLERS = """
    from jobqueue import Handlers

    def boom(conn, job):
        raise ValueError(f"no invoice {job.payload.get('invoice')}")

    handlers = Handlers({"boom": boom, "ok": lambda conn, job: None})
"""


@pytest.fixture
def conn(scratch: Scratch):
    with scratch.connect("worker", "test jobqueue ops", autocommit=True) as c:
        yield c


def worker(scratch: Scratch, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "ops_handlers.py").write_text(textwrap.dedent(HANDLERS))
    return subprocess.run([*PROG, *flags, "worker", "--handlers", "ops_handlers",
                           "--until-empty", "--backoff", "0", "--dsn", scratch.worker],
                          cwd=tmp_path, env=child_env(tmp_path), capture_output=True, text=True,
                          timeout=60)


def child_env(*paths: Path) -> dict[str, str]:
    """`paths` on the path (the installed package otherwise); no PG*/JOBQUEUE_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBQUEUE_", "PG"))}
    env["PYTHONPATH"] = os.pathsep.join(map(str, paths))
    return env


def runs(conn: psycopg.Connection, job: int) -> list[tuple[Any, ...]]:
    return conn.execute("select attempt, outcome, error from jobqueue.job_runs where job_id = %s "
                        "order by attempt", (job,)).fetchall()


def test_a_failing_job_is_logged_with_its_traceback_by_default_and_each_attempt_is_kept(
        scratch: Scratch, conn: psycopg.Connection, tmp_path: Path) -> None:
    boom = enqueue(conn, "boom", tenant=7, payload={"invoice": 42}, max_attempts=2)
    ok = enqueue(conn, "ok", tenant=8)
    r = worker(scratch, tmp_path)  # no -v
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    warning = [ln for ln in lines if " WARNING " in ln and f"job {boom} " in ln]
    error = [ln for ln in lines if " ERROR " in ln and f"job {boom} " in ln]
    assert len(warning) == 1 and "attempt 1 failed" in warning[0], r.stderr
    assert len(error) == 1 and "dead after attempt 2" in error[0], r.stderr
    assert r.stderr.count("Traceback (most recent call last)") == 2, r.stderr
    assert "ValueError: no invoice 42" in r.stderr and "in boom" in r.stderr
    assert f"job {ok} " not in r.stderr, "a success is logged only with -v"

    # Both failed attempts kept, with the error and where it was raised; the success too.
    got = runs(conn, boom)
    assert [(a, o) for a, o, _ in got] == [(1, "failed"), (2, "dead")]
    assert all(e.startswith("ValueError: no invoice 42") and "in boom" in e for _, _, e in got)
    assert [(a, o) for a, o, _ in runs(conn, ok)] == [(1, "done")]


def test_json_logs_are_one_object_per_line_with_the_jobs_fields(
        scratch: Scratch, conn: psycopg.Connection, tmp_path: Path) -> None:
    boom = enqueue(conn, "boom", tenant=3, max_attempts=1)
    ok = enqueue(conn, "ok", tenant=4)
    r = worker(scratch, tmp_path, "-v", "--log-format", "json")
    assert r.returncode == 0, r.stderr
    records = [json.loads(ln) for ln in r.stderr.splitlines()]  # every line parses
    by_job = {rec.get("job"): rec for rec in records if "job" in rec}
    dead, done = by_job[boom], by_job[ok]
    assert dead["level"] == "ERROR" and dead["outcome"] == "dead" and dead["attempt"] == 1
    assert dead["kind"] == "boom" and dead["tenant"] == "3" and dead["worker"]
    assert "ValueError" in dead["error"] and "Traceback" in dead["traceback"]
    assert {"time", "logger", "message"} <= set(dead)
    assert (done["level"], done["outcome"], done["kind"]) == ("INFO", "done", "ok")


def test_stats_jobs_and_show_say_what_failed_why_and_what_waits(
        scratch: Scratch, conn: psycopg.Connection,
        capsys: pytest.CaptureFixture[str]) -> None:
    calls = 0

    def boom(c: psycopg.Connection, job: Claim) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("broken")

    leased = Leased({"boom": boom}, backoff=0, heartbeat=None)
    dead = enqueue(conn, "boom", tenant=1, max_attempts=2)
    waiting = enqueue(conn, "nobody", tenant=2)  # no worker serves it
    for _ in range(2):
        assert leased.run_one(conn) is not None

    def cli(*args: str) -> Any:
        a = jq_cli.parser().parse_args([*args, "--json", "--dsn", scratch.worker])
        assert a.func(a) == 0
        return json.loads(capsys.readouterr().out)

    presence = Presence("ops-test", ["boom"], ttl=60)  # a running worker serving "boom"
    presence.touch(conn, start=True)
    stats = cli("stats")
    assert set(stats) >= {"jobs", "oldest_queued_s", "kinds_without_worker"}
    assert stats["jobs"]["dead"] == 1 and stats["jobs"]["queued"] == 1
    assert isinstance(stats["oldest_queued_s"], float) and stats["oldest_queued_s"] >= 0
    assert stats["kinds_without_worker"] == ["nobody"]
    presence.gone(conn)
    enqueue(conn, "boom", tenant=1)
    assert cli("stats")["kinds_without_worker"] == ["boom", "nobody"]  # nobody serves boom now

    listed = cli("jobs", "--status", "dead")
    assert [set(j) for j in listed] == [{"id", "kind", "tenant", "status", "attempts",
                                         "last_error"}]
    assert (listed[0]["id"], listed[0]["attempts"]) == (dead, 2)
    assert listed[0]["last_error"].startswith("ValueError: broken")
    assert [j["id"] for j in cli("jobs", "--kind", "nobody")] == [waiting]

    shown = cli("show", str(dead))
    assert (shown["id"], shown["status"], shown["kind"]) == (dead, "dead", "boom")
    assert [{k: a[k] for k in ("attempt", "outcome")} for a in shown["attempts"]] == [
        {"attempt": 1, "outcome": "failed"}, {"attempt": 2, "outcome": "dead"}]
    assert all(set(a) == {"attempt", "worker", "started", "finished", "outcome", "error"}
               for a in shown["attempts"])

    r = subprocess.run([*PROG, "show", "999999", "--dsn", scratch.worker], env=child_env(),
                       cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "python -m jobqueue show: no job 999999"], r.stderr


def test_retry_runs_a_dead_job_again_with_a_fresh_budget(conn: psycopg.Connection) -> None:
    fail = True

    def flaky(c: psycopg.Connection, job: Claim) -> None:
        if fail:
            raise RuntimeError("the mail server is down")

    leased = Leased({"mail": flaky}, backoff=0, heartbeat=None)
    job = enqueue(conn, "mail", tenant=5, max_attempts=1)
    assert leased.run_one(conn).status == "dead"  # type: ignore[union-attr]
    with pytest.raises(ops.WrongState, match=f"job {job} is dead: only a queued or running"):
        ops.cancel(conn, job)
    again = ops.retry(conn, job, attempts=2)
    assert (again["attempts"], again["max_attempts"]) == (1, 3)  # the count goes on
    fail = False
    assert leased.run_one(conn).status == "done"  # type: ignore[union-attr]
    shown = ops.show(conn, job)
    assert [(a["attempt"], a["outcome"]) for a in shown["attempts"]] == [(1, "dead"), (2, "done")]
    # Success keeps the last error (the story of what it recovered from); status says done.
    assert shown["status"] == "done" and shown["last_error"].startswith("RuntimeError")
    with pytest.raises(ops.WrongState, match="only a dead or cancelled job can be retried"):
        ops.retry(conn, job)
    with pytest.raises(ops.NoSuchJob):
        ops.retry(conn, 999999)


def test_cancel_a_queued_job_and_a_running_one_cooperatively(
        scratch: Scratch, conn: psycopg.Connection) -> None:
    with scratch.connect("admin", "test ops table", autocommit=True) as admin:
        admin.execute("create table job_writes (job_id bigint, attempt int, tenant_id int)")
        admin.execute(sql.SQL("grant select, insert on job_writes to {}").format(
            sql.Identifier(scratch.worker_role)))
    queued = enqueue(conn, "slow", tenant=1)
    assert ops.cancel(conn, queued) == "queued"
    leased = Leased({"slow": lambda c, j: None}, lease=1.5)  # heartbeat every 0.5 s
    assert leased.claim(conn) is None  # a cancelled job is never claimed

    seen: list[bool] = []

    def slow(c: psycopg.Connection, job: Claim) -> None:
        c.execute("insert into job_writes (job_id, attempt, tenant_id) values (%s, %s, 1)",
                  (job.id, job.attempt))  # work that must roll back
        deadline = time.monotonic() + 15
        while not job.cancelled() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append(job.cancelled())

    leased = Leased({"slow": slow}, lease=1.5)
    running = enqueue(conn, "slow", tenant=1)

    def operator() -> None:
        time.sleep(0.3)
        with scratch.connect("worker", "operator", autocommit=True) as other:
            assert ops.cancel(other, running) == "running"

    t = threading.Thread(target=operator)
    t.start()
    try:
        outcome = leased.run_one(conn)
    finally:
        t.join()
        leased.close()
    assert seen == [True], "the handler saw the cancel at a heartbeat"
    assert outcome is not None and outcome.status == "cancelled"  # its finish matched no row
    assert ops.show(conn, running)["status"] == "cancelled"
    assert [(a, o) for a, o, _ in runs(conn, running)] == [(1, "cancelled")]
    assert conn.execute("select count(*) from job_writes").fetchone() == (0,)  # rolled back
