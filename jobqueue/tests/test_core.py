"""The worker's core: handlers, batches, one heartbeat, the chained claim, prune, NOTIFY, flags."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from typing import Any

import psycopg
import pytest
from conftest import HERE, Scratch

from jobqueue import (
    Claim,
    Handlers,
    Leased,
    NullEvents,
    UnknownKind,
    Worker,
    WorkerOptions,
    enqueue,
    prune,
)
from jobqueue.options import add_flags, from_args, to_argv
from jobqueue.queries import q


def tenant_seen(c: psycopg.Connection, job: Claim) -> str:
    """Return the tenant the job's transaction runs as (set locally by the start)."""
    return str(c.execute("select current_setting('app.tenant')").fetchone()[0])  # type: ignore[index]


def fail(c: psycopg.Connection, job: Claim) -> None:
    c.execute("select 1/0")


def sleep(c: psycopg.Connection, job: Claim) -> None:
    time.sleep(float(job.payload["seconds"]))


H = Handlers({"who": tenant_seen, "fail": fail, "sleep": sleep})


@pytest.fixture
def conn(scratch: Scratch):
    with scratch.connect("worker", "test core", autocommit=True) as c:
        yield c


def status(conn: psycopg.Connection, job: int) -> tuple[str, int, str | None]:
    row = conn.execute("select status, attempts, last_error from jobqueue.jobs where id = %s",
                       (job,)).fetchone()
    assert row is not None
    return row


def many(conn: psycopg.Connection, kind: str, tenant: int, n: int = 1, **kw: Any) -> list[int]:
    with conn.transaction():
        return [enqueue(conn, kind, tenant=tenant, **kw) for _ in range(n)]


def test_any_kind_is_queued_and_one_without_a_handler_waits_for_a_worker_that_has_it(conn) -> None:
    handlers = Handlers()
    seen: list[tuple[str, dict[str, Any]]] = []

    @handlers.register("greet")
    def greet(c: psycopg.Connection, job: Claim) -> str:
        # Inside the job's transaction, the tenant set locally.
        seen.append((tenant_seen(c, job), job.payload))
        return f"hello {job.payload['who']}"

    with conn.transaction():
        greeting = enqueue(conn, "greet", tenant=7, payload={"who": "ada"})
        email = enqueue(conn, "email", tenant=7, max_attempts=1)
    worker = Leased(handlers, backoff=0)
    first = worker.run_one(conn)
    assert first is not None
    assert (first.claim.id, first.status, first.result) == (greeting, "done", "hello ada")
    assert seen == [("7", {"who": "ada"})]
    # The worker claims only the kinds it has: the email job is not burnt, it waits, queued.
    assert worker.run_one(conn) is None
    assert status(conn, email) == ("queued", 0, None)
    mailer = Handlers({"email": lambda c, job: "sent"})
    assert Leased(mailer, backoff=0).run_one(conn).status == "done"  # type: ignore[union-attr]
    with pytest.raises(UnknownKind, match="known: greet"):
        handlers.lookup(Claim(id=1, tenant_id=1, attempt=1, kind="nope"))


def test_handlers_take_a_mapping_and_refuse_a_second_handler_for_a_kind() -> None:
    def a(conn: Any, job: Any) -> None: ...

    def b(conn: Any, job: Any) -> None: ...

    hs = Handlers({"a": a})
    assert list(hs) == ["a"] and hs["a"] is a
    with pytest.raises(ValueError, match="already has a handler"):
        hs.add("a", b)


def test_a_batch_claim_counts_each_job_and_fences_each_finish(conn) -> None:
    ids = many(conn, "who", 2, 4)
    leased = Leased(H, lease=30)
    claims = leased.claim_many(conn, 3)
    assert [(c.id, c.attempt) for c in claims] == [(i, 1) for i in ids[:3]]
    # Another attempt takes the second job over (its lease expired, say): only it is fenced.
    conn.execute("update jobqueue.jobs set attempts = 2 where id = %s", (ids[1],))
    outcomes = [leased.run_claimed(conn, c) for c in claims]
    leased.close()
    assert [o.status for o in outcomes] == ["done", "fenced", "done"]
    assert status(conn, ids[3])[:2] == ("queued", 0)


def test_one_heartbeat_connection_extends_every_held_lease(conn) -> None:
    many(conn, "sleep", 1, 4, payload={"seconds": 0.3})
    leased = Leased(H, lease=2.0, heartbeat=0.1)
    beats: list[dict[str, Any]] = []

    class Log(NullEvents):
        def emit(self, event: str, **fields: Any) -> None:
            if event == "heartbeat":
                beats.append(fields)

    try:
        claims = leased.claim_many(conn, 4, events=Log())
        for c in claims:
            assert leased.run_claimed(conn, c).status == "done"
        hb = leased.heartbeats(conn)
        # The jobs waiting in the batch were extended too, all on one session.
        assert {b["job"] for b in beats} == {c.id for c in claims}
        assert hb.connections == 1
    finally:
        leased.close()


def test_prune_deletes_old_finished_jobs_in_batches_and_keeps_the_rest(conn) -> None:
    done = many(conn, "who", 3, 5)
    leased = Leased(H, heartbeat=None)
    while leased.run_one(conn) is not None:
        pass
    waiting = enqueue(conn, "who", tenant=3)
    assert prune(conn, 3600, batch=2) == {"jobs": 0, "job_runs": 0}  # nothing that old
    assert prune(conn, 0, batch=2) == {"jobs": 5, "job_runs": 5}
    left = [r[0] for r in conn.execute("select id from jobqueue.jobs order by id")]
    assert left == [waiting] and not set(done) & set(left)


def test_enqueue_notifies_listening_workers_when_it_commits(scratch: Scratch, conn) -> None:
    with scratch.connect("worker", "test listen", autocommit=True) as listener:
        listener.execute(q("listen"))
        with conn.transaction():
            enqueue(conn, "anything", tenant=1)
        got = list(listener.notifies(timeout=10, stop_after=1))
        assert [n.channel for n in got] == ["jobqueue"]


def test_worker_options_are_one_dataclass_that_makes_the_flags() -> None:
    p = argparse.ArgumentParser()
    add_flags(p, WorkerOptions)
    options = WorkerOptions(lease=5.0, heartbeat=1.0, batch=4, listen=False, until_empty=True,
                            tenant_setting="acme.tenant")
    argv = to_argv(options)
    assert argv == ["--lease", "5.0", "--heartbeat", "1.0", "--batch", "4", "--no-listen",
                    "--until-empty", "--tenant-setting", "acme.tenant"]
    assert from_args(WorkerOptions, p.parse_args(argv)) == options


def test_exit_statuses_tell_a_supervisor_what_happened() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nowhere = f"host=127.0.0.1 port={port} dbname=none user=none connect_timeout=1"
    cmd = [sys.executable, "-m", "jobqueue", "--dsn", nowhere, "--handlers", "noop_handlers"]
    env = dict(os.environ, PYTHONPATH=str(HERE))
    bad = subprocess.run([*cmd, "--lease", "2", "--heartbeat", "3"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert bad.returncode == 2, bad.stderr
    assert "must be shorter than the lease" in bad.stderr
    # A server not reachable at start is an outage (PostgreSQL may start after the worker): waited
    # for up to --max-outage, then exit 3, which a supervisor restarts (2 it does not).
    never = subprocess.run([*cmd, "--max-outage", "1"], capture_output=True, text=True,
                           timeout=60, env=env)
    assert never.returncode == 3, never.stderr
    assert "cannot reach the server at start" in never.stderr, never.stderr
    assert "could not reach the server for" in never.stderr and "Traceback" not in never.stderr


def test_the_next_claim_rides_on_the_finish_and_a_fenced_finish_takes_it_back(conn) -> None:
    first, second, third = many(conn, "who", 4, 3)
    leased = Leased(H, lease=30, heartbeat=None)
    claim = leased.claim(conn)
    assert claim is not None
    done = leased.execute(conn, claim, claim_next=1)
    assert (done.status, [(c.id, c.attempt) for c in done.claimed]) == ("done", [(second, 1)])
    assert status(conn, second)[:2] == ("running", 1)  # counted before its work starts
    nxt = done.claimed[0]
    conn.execute("update jobqueue.jobs set attempts = 2 where id = %s", (second,))  # taken over
    fenced = leased.execute(conn, nxt, claim_next=1)
    assert (fenced.status, fenced.claimed) == ("fenced", [])
    assert status(conn, third)[:2] == ("queued", 0)  # its claim rolled back with the rest
    assert status(conn, first)[:2] == ("done", 1)


def test_a_batch_in_one_commit_still_fences_and_counts_each_job_on_its_own(conn) -> None:
    ok, = many(conn, "who", 5)
    poison, = many(conn, "fail", 5, max_attempts=1)
    taken, last, nxt = many(conn, "who", 5, 3)
    leased = Leased(H, lease=30, backoff=0, heartbeat=None)
    claims = leased.claim_many(conn, 4)
    conn.execute("update jobqueue.jobs set attempts = 2 where id = %s", (taken,))  # not ours now
    outcomes = leased.run_together(conn, claims, claim_next=1)
    assert [(o.claim.id, o.status) for o in outcomes] == [
        (ok, "done"), (poison, "dead"), (taken, "fenced"), (last, "done")]
    assert [o.result for o in outcomes if o.status == "done"] == ["5"] * 2
    assert [(c.id, c.attempt) for c in outcomes[-1].claimed] == [(nxt, 1)]
    runs = dict(conn.execute("select job_id, string_agg(outcome, ',') from jobqueue.job_runs "
                             "group by job_id").fetchall())
    # The fenced and the failed executions rolled back to their savepoints; their own records
    # (outcome dead, fenced) were written after that and committed with the batch.
    assert runs == {ok: "done", poison: "dead", taken: "fenced", last: "done"}
    assert status(conn, poison)[:2] == ("dead", 1) and status(conn, nxt)[:2] == ("running", 1)


def test_a_batch_in_one_commit_runs_each_job_as_its_own_tenant(conn) -> None:
    # The next job's tenant is set in the same round trip as the previous job's finish; a
    # fenced finish rolls that back, and the next job sets its tenant again.
    ids = [many(conn, "who", t)[0] for t in (1, 2, 3, 4, 5)]
    leased = Leased(H, lease=30, backoff=0, heartbeat=None)
    claims = leased.claim_many(conn, 5)
    conn.execute("update jobqueue.jobs set attempts = 2 where id = %s", (ids[2],))  # taken over
    outcomes = leased.run_together(conn, claims)
    assert [(o.claim.tenant_id, o.status, o.result) for o in outcomes] == [
        (1, "done", "1"), (2, "done", "2"), (3, "fenced", None), (4, "done", "4"),
        (5, "done", "5")]
    runs = dict(conn.execute("select job_id, count(*) from jobqueue.job_runs "
                             "where outcome = 'done' group by job_id").fetchall())
    assert runs == {ids[0]: 1, ids[1]: 1, ids[3]: 1, ids[4]: 1}


def test_a_batch_of_ten_in_one_commit_fails_only_the_failing_job_and_skips_one_taken_over(
        conn) -> None:
    # Ten jobs of ten tenants in one --batch-commit batch: job 4 writes, then raises; job 6 is
    # taken over (another attempt) before the batch starts; job 8 does nothing with the database.
    ran: list[int] = []

    def who(c: psycopg.Connection, job: Claim) -> str:
        ran.append(job.id)
        return tenant_seen(c, job)

    def writes_then_raises(c: psycopg.Connection, job: Claim) -> None:
        ran.append(job.id)
        enqueue(c, "who", tenant=99)  # rolled back with the job
        raise RuntimeError("job 4 broke")

    def nothing(c: psycopg.Connection, job: Claim) -> None:
        ran.append(job.id)

    kinds = {4: "boom", 8: "nothing"}
    ids = [many(conn, kinds.get(t, "who"), t, max_attempts=2)[0] for t in range(1, 11)]
    leased = Leased(Handlers({"who": who, "boom": writes_then_raises, "nothing": nothing}),
                    lease=30, backoff=0, heartbeat=None)
    claims = leased.claim_many(conn, 10)
    conn.execute("update jobqueue.jobs set attempts = 2 where id = %s", (ids[5],))  # taken over
    outcomes = leased.run_together(conn, claims)
    assert [(o.claim.id, o.status) for o in outcomes] == [
        (i, {3: "queued", 5: "fenced"}.get(k, "done")) for k, i in enumerate(ids)]
    assert ran == [i for k, i in enumerate(ids) if k != 5]  # job 6 never ran
    # Each ran as its own tenant, the one set for it (bound) in the batch.
    assert [o.result for o in outcomes if o.claim.kind == "who" and o.status == "done"] == [
        str(t) for t in (1, 2, 3, 5, 7, 9, 10)]
    assert status(conn, ids[3])[:2] == ("queued", 1) and "job 4 broke" in status(conn, ids[3])[2]
    assert status(conn, ids[5])[:2] == ("running", 2)  # the other attempt's, untouched
    assert conn.execute("select count(*) from jobqueue.jobs where tenant_id = 99").fetchone() == (0,)
    runs = conn.execute("select job_id, attempt, outcome, started, finished, id "
                        "from jobqueue.job_runs").fetchall()
    # One row per job, each with its own attempt (job 6's: the attempt this worker claimed).
    assert sorted((r[0], r[1], r[2]) for r in runs) == sorted(
        (i, 1, {3: "failed", 5: "fenced"}.get(k, "done")) for k, i in enumerate(ids))
    done = {r[0]: r for r in runs if r[2] == "done"}
    assert len(done) == 8 and all(r[3] <= r[4] for r in done.values())
    starts = [done[i][3] for i in ids if i in done]
    assert starts == sorted(starts) and len(set(starts)) == 8  # each job's own start
    assert {o.claim.id: o.claim.run_id for o in outcomes if o.status == "done"} == {
        i: r[5] for i, r in done.items()}


def test_a_batch_in_one_commit_keeps_a_handlers_own_mischief_to_its_job(conn) -> None:
    # The batch holds its rows locked: only its own transaction can change them. A handler that
    # cancels its own job is fenced at the finish; one that swallows its own statement's error
    # (its transaction aborted) fails; one that raises before sending anything fails without
    # undoing the job before it; the others are done, each as its tenant, none runs twice.
    def cancels_itself(c: psycopg.Connection, job: Claim) -> None:
        c.execute("update jobqueue.jobs set status = 'cancelled' where id = %s", (job.id,))

    def swallows_its_error(c: psycopg.Connection, job: Claim) -> None:
        try:
            c.execute("select 1/0")
        except psycopg.errors.DivisionByZero:
            pass  # and returns: its transaction is aborted

    def writes(c: psycopg.Connection, job: Claim) -> None:
        enqueue(c, "who", tenant=77)  # kept: this job is done

    def raises_at_once(c: psycopg.Connection, job: Claim) -> None:
        raise ValueError("nothing sent")  # nothing to roll back: the job before keeps its write

    def server_bound(c: psycopg.Connection, job: Claim) -> str:
        row = psycopg.Cursor(c).execute("select current_setting('app.tenant')").fetchone()
        return str(row[0]) if row else ""

    first, = many(conn, "who", 1)
    odd, = many(conn, "odd", 2)
    swallow, = many(conn, "swallow", 3, max_attempts=1)
    writer, = many(conn, "writes", 4)
    raiser, = many(conn, "raise", 5, max_attempts=1)
    last, = many(conn, "bound", 6)
    leased = Leased(Handlers({"who": tenant_seen, "odd": cancels_itself, "writes": writes,
                              "swallow": swallows_its_error, "raise": raises_at_once,
                              "bound": server_bound}), lease=30, heartbeat=None)
    outcomes = leased.run_together(conn, leased.claim_many(conn, 6))
    assert [(o.claim.id, o.status) for o in outcomes] == [
        (first, "done"), (odd, "fenced"), (swallow, "dead"), (writer, "done"), (raiser, "dead"),
        (last, "done")]
    assert [status(conn, j)[0] for j in (first, odd, swallow, writer, raiser, last)] == [
        "done", "cancelled", "dead", "done", "dead", "done"]
    assert outcomes[-1].result == "6"  # its own tenant, by server-side binding too
    assert conn.execute("select count(*) from jobqueue.jobs where tenant_id = 77").fetchone() == (1,)


def test_a_batch_in_one_commit_refuses_a_handlers_commit_and_fails_only_its_job(conn) -> None:
    # The batch sends BEGIN and COMMIT itself (psycopg's transaction() would refuse a commit()).
    # A handler that calls conn.commit() fails alone, its write rolled back; before, the jobs
    # before it were committed unfinished and the whole batch raised (every job rerun).
    def writes(tenant: int) -> Any:
        return lambda c, job: enqueue(c, "who", tenant=tenant)

    def commits(c: psycopg.Connection, job: Claim) -> None:
        enqueue(c, "who", tenant=78)
        c.commit()

    before, = many(conn, "w77", 1)
    committer, = many(conn, "commit", 2, max_attempts=1)
    after, = many(conn, "w79", 3)
    leased = Leased(Handlers({"w77": writes(77), "commit": commits, "w79": writes(79)}),
                    lease=30, heartbeat=None)
    outcomes = leased.run_together(conn, leased.claim_many(conn, 3))
    assert [(o.claim.id, o.status) for o in outcomes] == [
        (before, "done"), (committer, "dead"), (after, "done")]
    assert "may not commit" in (outcomes[1].error or "")
    assert conn.execute("select tenant_id::bigint from jobqueue.jobs where kind = 'who' "
                        "order by 1").fetchall() == [(77,), (79,)]


def test_the_watchdog_fails_a_job_of_a_locked_batch_without_waiting_for_it(conn) -> None:
    # A job past its maximum runtime in a --batch-commit batch: the heartbeat cannot fail it (the
    # batch holds its row) and does not wait; the batch fails it when its handler returns.
    slow, = many(conn, "sleep", 1, payload={"seconds": 1.6})
    after, = many(conn, "who", 2)
    handlers = Handlers({"sleep": sleep})
    handlers.register("who", max_runtime=60)(tenant_seen)  # only the slow one is overdue
    leased = Leased(handlers, lease=2, heartbeat=0.5, max_runtime=1, backoff=0)
    try:
        outcomes = leased.run_together(conn, leased.claim_many(conn, 2))
    finally:
        leased.close()
    assert [(o.claim.id, o.status) for o in outcomes] == [(slow, "queued"), (after, "done")]
    assert "maximum runtime" in (status(conn, slow)[2] or "")
    assert conn.execute("select outcome from jobqueue.job_runs where job_id = %s",
                        (slow,)).fetchall() == [("failed",)]


def test_a_worker_with_batch_commit_runs_everything_to_a_final_state(scratch: Scratch,
                                                                     conn) -> None:
    many(conn, "who", 1, 23)
    many(conn, "fail", 9)
    options = WorkerOptions(batch=5, batch_commit=True, until_empty=True, listen=False,
                            backoff=0, name="batcher")
    assert Worker(scratch.worker, options, H).run() == 23 + 3
    states = set(conn.execute("select kind, status, attempts from jobqueue.jobs").fetchall())
    assert states == {("who", "done", 1), ("fail", "dead", 3)}
