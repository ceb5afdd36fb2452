"""The production worker on its own: its boundary, handlers, batches, one heartbeat, prune."""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from jobqueue import (
    Claim,
    Handlers,
    Leased,
    NullEvents,
    UnknownKind,
    WorkerOptions,
    enqueue,
    prune,
)
from jobqueue.options import add_flags, from_args, to_argv

from tenantlab import db, queue
from tenantlab.queries import q


@pytest.fixture
def conn(scratch: db.Scratch):
    with scratch.connect("worker", "test jobqueue", autocommit=True) as c:
        yield c


def status(conn: psycopg.Connection, job: int) -> tuple[str, int, str | None]:
    row = conn.execute("select status, attempts, last_error from jobs where id = %s",
                       (job,)).fetchone()
    assert row is not None
    return row


def test_any_kind_is_queued_and_one_without_a_handler_waits_for_a_worker_that_has_it(conn) -> None:
    handlers = Handlers()
    seen: list[tuple[str | None, dict[str, Any]]] = []

    @handlers.register("greet")
    def greet(c: psycopg.Connection, job: Claim) -> str:
        # Inside the job's transaction, the tenant set locally.
        seen.append((c.execute(q("tenant_current")).fetchone()[0], job.payload))
        return f"hello {job.payload['who']}"

    with conn.transaction():
        greeting = enqueue(conn, "greet", tenant=7, payload={"who": "ada"})
        email = enqueue(conn, "email", tenant=7, max_attempts=1)
    worker = Leased(handlers, backoff=0)
    first = worker.run_one(conn)
    assert (first.claim.id, first.status, first.result) == (greeting, "done", "hello ada")
    assert seen == [("7", {"who": "ada"})]
    # The worker claims only the kinds it has: the email job is not burnt, it waits, queued.
    assert worker.run_one(conn) is None
    assert status(conn, email) == ("queued", 0, None)
    mailer = Handlers({"email": lambda c, job: "sent"})
    assert Leased(mailer, backoff=0).run_one(conn).status == "done"
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
    ids = queue.enqueue(conn, "count", tenant=2, count=4)
    leased = queue.Leased(lease=30)
    claims = leased.claim_many(conn, 3)
    assert [(c.id, c.attempt) for c in claims] == [(i, 1) for i in ids[:3]]
    # Another attempt takes the second job over (its lease expired, say): only it is fenced.
    conn.execute("update jobs set attempts = 2 where id = %s", (ids[1],))
    outcomes = [leased.run_claimed(conn, c) for c in claims]
    assert [o.status for o in outcomes] == ["done", "fenced", "done"]
    assert status(conn, ids[3])[:2] == ("queued", 0)


def test_one_heartbeat_connection_extends_every_held_lease(scratch: db.Scratch, conn) -> None:
    queue.enqueue(conn, "sleep", tenant=1, seconds=0.3, count=4)
    leased = queue.Leased(lease=2.0, heartbeat=0.1)
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
    done = queue.enqueue(conn, "count", tenant=3, count=5)
    leased = queue.Leased()
    while leased.run_one(conn) is not None:
        pass
    waiting = queue.enqueue(conn, "count", tenant=3)[0]
    assert prune(conn, 3600, batch=2) == {"jobs": 0, "job_runs": 0}  # nothing that old
    assert prune(conn, 0, batch=2) == {"jobs": 5, "job_runs": 5}
    left = [s["id"] for s in queue.job_states(conn)]
    assert left == [waiting] and not set(done) & set(left)


def test_enqueue_notifies_listening_workers_when_it_commits(scratch: db.Scratch, conn) -> None:
    with scratch.connect("worker", "test listen", autocommit=True) as listener:
        listener.execute(q("listen"))
        with conn.transaction():
            enqueue(conn, "anything", tenant=1)
        t0 = time.monotonic()
        got = list(listener.notifies(timeout=10, stop_after=1))
        assert [n.channel for n in got] == ["jobqueue"]
        assert time.monotonic() - t0 < 10


def test_worker_options_are_one_dataclass_that_makes_the_flags() -> None:
    p = argparse.ArgumentParser()
    add_flags(p, WorkerOptions)
    options = WorkerOptions(lease=5.0, heartbeat=1.0, batch=4, listen=False, until_empty=True)
    argv = to_argv(options)
    assert argv == ["--lease", "5.0", "--heartbeat", "1.0", "--batch", "4", "--no-listen",
                    "--until-empty"]
    assert from_args(WorkerOptions, p.parse_args(argv)) == options


def test_exit_statuses_tell_a_supervisor_what_happened() -> None:
    from tenantlab.server import free_port

    nowhere = f"host=127.0.0.1 port={free_port()} dbname=none user=none connect_timeout=1"
    cmd = [sys.executable, "-m", "jobqueue", "--dsn", nowhere,
           "--handlers", "tenantlab.kinds"]
    bad = subprocess.run([*cmd, "--lease", "2", "--heartbeat", "3"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2, bad.stderr
    assert "must be shorter than the lease" in bad.stderr
    # A server never reached is a configuration error, not an outage (exit 3 is for a server
    # that was there and went away: tests/test_jobqueue_cli.py cuts one off through a proxy).
    never = subprocess.run([*cmd, "--max-outage", "1"], capture_output=True, text=True,
                           timeout=60)
    assert never.returncode == 2, never.stderr
    assert "cannot reach the server" in never.stderr and "Traceback" not in never.stderr


def test_the_next_claim_rides_on_the_finish_and_a_fenced_finish_takes_it_back(conn) -> None:
    first, second, third = queue.enqueue(conn, "count", tenant=4, count=3)
    leased = queue.Leased(lease=30)
    claim = leased.claim(conn)
    done = leased.execute(conn, claim, claim_next=1)
    assert (done.status, [(c.id, c.attempt) for c in done.claimed]) == ("done", [(second, 1)])
    assert status(conn, second)[:2] == ("running", 1)  # counted before its work starts
    nxt = done.claimed[0]
    conn.execute("update jobs set attempts = 2 where id = %s", (second,))  # taken over
    fenced = leased.execute(conn, nxt, claim_next=1)
    assert (fenced.status, fenced.claimed) == ("fenced", [])
    assert status(conn, third)[:2] == ("queued", 0)  # its claim rolled back with the rest
    assert status(conn, first)[:2] == ("done", 1)


def test_a_batch_in_one_commit_still_fences_and_counts_each_job_on_its_own(conn) -> None:
    ok, poison, taken, last, nxt = (queue.enqueue(conn, "count", tenant=5)
                                    + queue.enqueue(conn, "fail", tenant=5, max_attempts=1)
                                    + queue.enqueue(conn, "count", tenant=5, count=3))
    leased = queue.Leased(lease=30, backoff=0)
    claims = leased.claim_many(conn, 4)
    conn.execute("update jobs set attempts = 2 where id = %s", (taken,))  # another attempt owns it
    outcomes = leased.run_together(conn, claims, claim_next=1)
    assert [(o.claim.id, o.status) for o in outcomes] == [
        (ok, "done"), (poison, "dead"), (taken, "fenced"), (last, "done")]
    assert [o.result for o in outcomes if o.status == "done"] == [20000 // 5] * 2
    assert [(c.id, c.attempt) for c in outcomes[-1].claimed] == [(nxt, 1)]
    runs = dict(conn.execute("select job_id, string_agg(outcome, ',') from job_runs "
                             "group by job_id").fetchall())
    # The fenced and the failed executions rolled back to their savepoints; their own records
    # (outcome dead, fenced) were written after that and committed with the batch.
    assert runs == {ok: "done", poison: "dead", taken: "fenced", last: "done"}
    assert status(conn, poison)[:2] == ("dead", 1) and status(conn, nxt)[:2] == ("running", 1)


def test_a_batch_in_one_commit_runs_each_job_as_its_own_tenant(conn) -> None:
    # The next job's tenant is set in the same round trip as the previous job's finish; a
    # fenced finish rolls that back, and the next job sets its tenant again.
    ids = [queue.enqueue(conn, "count", tenant=t)[0] for t in (1, 2, 3, 4, 5)]
    leased = queue.Leased(lease=30, backoff=0)
    claims = leased.claim_many(conn, 5)
    conn.execute("update jobs set attempts = 2 where id = %s", (ids[2],))  # tenant 3: taken over
    outcomes = leased.run_together(conn, claims)
    assert [(o.claim.tenant_id, o.status, o.result) for o in outcomes] == [
        (1, "done", 20000), (2, "done", 10000), (3, "fenced", None), (4, "done", 5000),
        (5, "done", 4000)]
    runs = dict(conn.execute("select job_id, count(*) from job_runs where outcome = 'done' "
                             "group by job_id").fetchall())
    assert runs == {ids[0]: 1, ids[1]: 1, ids[3]: 1, ids[4]: 1}

def test_a_batch_in_one_commit_finishes_with_the_designs_own_finish(conn) -> None:
    # The lab's naive lease-only queue (no fence) batched too: the taken-over job is finished
    # anyway, as that design does one job at a time.
    taken, other = queue.enqueue(conn, "count", tenant=2, count=2)
    naive = queue.Leased(lease=30, fence=False)
    claims = naive.claim_many(conn, 2)
    conn.execute("update jobs set attempts = 2 where id = %s", (taken,))
    outcomes = naive.run_together(conn, claims)
    assert [(o.claim.id, o.status) for o in outcomes] == [(taken, "done"), (other, "done")]
    assert status(conn, taken)[:2] == ("done", 2)

def test_a_worker_with_batch_commit_runs_everything_to_a_final_state(scratch: db.Scratch,
                                                                     conn) -> None:
    from jobqueue import Worker

    from tenantlab import kinds

    queue.enqueue(conn, "count", count=23)
    queue.enqueue(conn, "fail", tenant=9)
    options = WorkerOptions(batch=5, batch_commit=True, until_empty=True, listen=False,
                            backoff=0, name="batcher")
    assert Worker(scratch.worker, options, kinds.handlers).run() == 23 + 3
    states = {(s["kind"], s["status"], s["attempts"]) for s in queue.job_states(conn)}
    assert states == {("count", "done", 1), ("fail", "dead", 3)}


# The lab on the product (moved from the product's own defaults tests) -------------------------

def test_the_lab_worker_overrides_no_private_method() -> None:
    private = [name for name, value in vars(queue.Leased).items()
               if name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
               and (inspect.isfunction(value)
                    or isinstance(value, (staticmethod, classmethod, property)))]
    assert private == [], f"tenantlab.queue.Leased overrides private methods: {private}"


def test_both_command_lines_refuse_fair_with_lossy_claim(scratch: db.Scratch,
                                                        env_with_db: dict[str, str],
                                                        tmp_path: Path) -> None:
    flags = ["--fair", "round-robin", "--lossy-claim", "--until-empty", "--dsn", scratch.worker]
    jq = subprocess.run([sys.executable, "-m", "jobqueue", *flags],
                        capture_output=True, text=True, timeout=60)
    lab = subprocess.run([sys.executable, "-m", "tenantlab", "worker", *flags,
                          "--events", str(tmp_path / "events.jsonl")],
                         env=env_with_db, capture_output=True, text=True, timeout=60)
    assert jq.returncode == 2, jq.stderr
    assert lab.returncode == 2, f"tenantlab worker accepted it (exit {lab.returncode}): " \
                                f"{lab.stderr.strip()}"
    # One validation for both: the same message after each command's own prefix.
    def message(err: str) -> str:
        return err.strip().splitlines()[-1].split(": ", 1)[-1]
    assert message(lab.stderr) == message(jq.stderr)
