"""Issue 19, safe by default: what the production worker does when given only a lease.

Each test asserts behaviour (executions counted outside the database, attempts, statuses,
rows), never a duration: the waits below only bound how long a test may take to see it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Scratch
from psycopg import sql

from jobqueue import (
    Claim,
    ConfigError,
    HeartbeatConfig,
    Heartbeats,
    Leased,
    Reaper,
    Worker,
    WorkerOptions,
    enqueue,
)

FINAL = ("done", "dead")

# Handlers for workers started as `python -m jobqueue --handlers defaults_jobs`:
# each execution appends a line to a file (outside the database, so a rollback cannot hide it).
HANDLERS_MODULE = textwrap.dedent("""
    import os, time

    from jobqueue import Handlers

    def slow(conn, job):
        with open(os.environ["DEFAULTS_EXECUTIONS"], "a") as f:
            f.write(f"{job.id} {job.attempt}\\n")
        time.sleep(float(job.payload["seconds"]))

    handlers = Handlers({"slow": slow})
""")


@pytest.fixture
def conn(scratch: Scratch) -> Iterator[psycopg.Connection]:
    with scratch.connect("worker", "test defaults", autocommit=True) as c:
        yield c


def state(conn: psycopg.Connection, job: int) -> tuple[str, int]:
    row = conn.execute("select status, attempts from jobqueue.jobs where id = %s", (job,)).fetchone()
    assert row is not None, f"job {job} is gone"
    return row[0], row[1]


def wait_until(check: Callable[[], bool], limit: float) -> bool:
    """Poll `check` until it holds or `limit` seconds pass; return whether it held."""
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def all_final(conn: psycopg.Connection, ids: list[int]) -> Callable[[], bool]:
    def check() -> bool:
        return bool(conn.execute("select bool_and(status in ('done', 'dead')) from jobqueue.jobs "
                                 "where id = any(%s)", (ids,)).fetchone()[0])
    return check


class InThread:
    """A worker running in a thread of this process; its error, if any, kept for the test."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="test worker")

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as e:  # noqa: BLE001 - reported by the test, not lost in a thread
            self.error = e


@contextmanager
def in_thread(worker: Worker) -> Iterator[InThread]:
    """Run `worker` in a thread; at the end let it end on its own (``until_empty``), or stop it."""
    w = InThread(worker)
    w.thread.start()
    try:
        yield w
    finally:
        w.thread.join(30 if worker.options.until_empty else 0)
        if w.thread.is_alive() and not worker.stopping:
            worker.stop()  # after its current job
        w.thread.join(30)
        assert not w.thread.is_alive(), "the worker did not stop within 30 s"


@contextmanager
def cli_workers(n: int, flags: list[str], dsn: str, tmp_path: Path) -> Iterator[Path]:
    """Start `n` ``python -m jobqueue`` workers; yield the executions file; stop them."""
    (tmp_path / "defaults_jobs.py").write_text(HANDLERS_MODULE)
    executions = tmp_path / "executions"
    executions.touch()
    env = dict(os.environ, JOBQUEUE_DSN=dsn, DEFAULTS_EXECUTIONS=str(executions),
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path),
                                                        os.environ.get("PYTHONPATH")])))
    procs = [subprocess.Popen([sys.executable, "-m", "jobqueue", "--handlers",
                               "defaults_jobs", *flags], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        yield executions
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)  # after the current job
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stderr is not None:
                p.stderr.close()


def executions_of(path: Path) -> Counter[int]:
    return Counter(int(line.split()[0]) for line in path.read_text().splitlines())


# 1 ------------------------------------------------------------------------------------------

def test_a_job_longer_than_the_lease_runs_once_with_the_lease_as_the_only_flag(
        scratch: Scratch, conn: psycopg.Connection, tmp_path: Path) -> None:
    with conn.transaction():
        job = enqueue(conn, "slow", tenant=1, payload={"seconds": 4})
    with cli_workers(2, ["--lease", "2"], scratch.worker, tmp_path) as executions:
        # A second worker is there to take the job over the moment its lease runs out.
        finished = wait_until(all_final(conn, [job]), 30)
    assert executions_of(executions) == {job: 1}, \
        "a 4 s job with --lease 2 and no other flag ran more than once: the heartbeat is off"
    assert finished and state(conn, job) == ("done", 1)


# 2 ------------------------------------------------------------------------------------------

def test_the_lease_alone_gives_a_heartbeat_that_moves_locked_until(
        scratch: Scratch, conn: psycopg.Connection) -> None:
    started, release = threading.Event(), threading.Event()

    def hold(c: psycopg.Connection, job: Claim) -> None:
        started.set()
        release.wait(15)

    with conn.transaction():
        job = enqueue(conn, "hold", tenant=1)

    def lease() -> Any:
        return conn.execute("select locked_until from jobqueue.jobs where id = %s", (job,)).fetchone()[0]

    options = WorkerOptions(lease=2.0, until_empty=True, listen=False)
    with in_thread(Worker(scratch.worker, options, {"hold": hold})) as w:
        try:
            assert started.wait(15), "the worker never started the job"
            first = lease()
            # Up to three leases: a heartbeat at a fraction of the lease moves it well before.
            moved = wait_until(lambda: lease() > first, 6)
        finally:
            release.set()
    assert w.error is None, w.error
    assert moved, "locked_until never moved while the job ran: --lease 2 alone has no heartbeat"
    assert state(conn, job) == ("done", 1)


# 3 ------------------------------------------------------------------------------------------

def test_a_batch_longer_than_the_lease_runs_each_job_once(
        scratch: Scratch, conn: psycopg.Connection, tmp_path: Path) -> None:
    with conn.transaction():
        ids = [enqueue(conn, "slow", tenant=1, payload={"seconds": 1}) for _ in range(6)]
    with cli_workers(2, ["--lease", "2", "--batch", "6"], scratch.worker,
                     tmp_path) as executions:
        finished = wait_until(all_final(conn, ids), 30)
    ran = executions_of(executions)
    assert ran == dict.fromkeys(ids, 1), \
        f"{sum(ran.values())} executions for 6 jobs: the batch's later leases ran out as they waited"
    assert finished and [state(conn, i) for i in ids] == [("done", 1)] * 6


# 4 ------------------------------------------------------------------------------------------

def test_the_reaper_by_default_leaves_a_lease_that_expired_a_moment_ago(
        conn: psycopg.Connection) -> None:
    with conn.transaction():
        job = enqueue(conn, "slow", tenant=1, max_attempts=1)
    # Its last attempt, still running (a GC pause, a slow beat): the lease ran out just now.
    conn.execute("update jobqueue.jobs set status = 'running', attempts = 1, "
                 "locked_until = clock_timestamp() - interval '1 second' where id = %s", (job,))
    assert Reaper(conn).run_once() == [], "the default reaper has no grace: it reaped a live job"
    assert state(conn, job) == ("running", 1)
    # Long past any grace, the same job is reaped: the reaper still works.
    conn.execute("update jobqueue.jobs set locked_until = clock_timestamp() - interval '1 hour' "
                 "where id = %s", (job,))
    assert [r["id"] for r in Reaper(conn).run_once()] == [job]
    assert state(conn, job) == ("dead", 1)


# 5 ------------------------------------------------------------------------------------------

def test_a_claim_whose_lease_expired_before_its_start_is_not_started(
        scratch: Scratch, conn: psycopg.Connection) -> None:
    calls: list[tuple[int, int]] = []
    handlers = {"once": lambda c, job: calls.append((job.id, job.attempt))}
    with conn.transaction():
        taken = enqueue(conn, "once", tenant=1)
        expired = enqueue(conn, "once", tenant=2)
    # A worker that claims two jobs and then pauses (SIGSTOP, a long GC): no heartbeat beats.
    paused = Leased(handlers, lease=0.2, heartbeat=None)
    other = Leased(handlers, lease=30, heartbeat=None)
    try:
        claims = paused.claim_many(conn, 2)
        assert [c.id for c in claims] == [taken, expired]
        assert wait_until(lambda: conn.execute(
            "select bool_and(locked_until < clock_timestamp()) from jobqueue.jobs where id = any(%s)",
            ([taken, expired],)).fetchone()[0], 10)
        with scratch.connect("worker", "test defaults other", autocommit=True) as c2:
            takeover = other.claim(c2)  # the first job is another worker's now
            assert (takeover.id, takeover.attempt) == (taken, 2)
            # The paused worker resumes: neither job may start, taken over or merely expired.
            outcomes = [paused.run_claimed(conn, c) for c in claims]
            assert calls == [], f"the handler ran for claims whose lease had expired: {calls}"
            assert [o.status for o in outcomes] == ["fenced", "fenced"]
            assert other.run_claimed(c2, takeover).status == "done"
    finally:
        paused.close()
        other.close()
    assert calls == [(taken, 2)]
    assert state(conn, taken) == ("done", 2)
    assert state(conn, expired)[1] == 1 and state(conn, expired)[0] != "done"


# 6 ------------------------------------------------------------------------------------------

def test_the_heartbeat_does_not_wait_on_a_locked_row(scratch: Scratch,
                                                     conn: psycopg.Connection) -> None:
    with conn.transaction():
        ids = [enqueue(conn, "held", tenant=1) for _ in range(3)]
    claims = Leased({"held": lambda c, job: None}, lease=30, heartbeat=None).claim_many(conn, 3)
    beats = Heartbeats(scratch.worker, HeartbeatConfig(lease=2.0, interval=0.1), name="test")
    try:
        held = {c.id: beats.hold(c) for c in claims}
        assert wait_until(lambda: all(h.beats >= 1 for h in held.values()), 10)
        locked, others = ids[1], [held[ids[0]], held[ids[2]]]
        with scratch.connect("worker", "test defaults lock") as locker:
            # A batch transaction (or anyone) holding the middle job's row lock.
            locker.execute("select 1 from jobqueue.jobs where id = %s for update", (locked,))
            before = [h.beats for h in others]
            rising = wait_until(lambda: all(h.beats >= b + 3 for h, b in zip(others, before, strict=True)), 5)
            lost_while_locked = held[locked].lost
            locker.rollback()
        assert rising, "the heartbeat waited on the locked row: the other jobs' beats stopped"
        assert not lost_while_locked, "a locked row is still this worker's: it is not lost"
        # Once the lock is gone the locked job is beaten again, still owned.
        after = held[locked].beats
        assert wait_until(lambda: held[locked].beats > after, 5)
        assert not any(h.lost for h in held.values())
    finally:
        for c in claims:
            beats.release(c)
        beats.close()


# 7 ------------------------------------------------------------------------------------------

SYNC_PROBE = """
create table sync_probe (job bigint primary key, in_handler text not null);
create table sync_at_commit (job bigint primary key, at_commit text not null);
-- Deferred: fires at COMMIT, so it sees the setting the whole transaction committed with.
create function record_sync_at_commit() returns trigger language plpgsql as $$
begin
  insert into sync_at_commit values (new.job, current_setting('synchronous_commit'));
  return null;
end $$;
create constraint trigger sync_at_commit after insert on sync_probe
  deferrable initially deferred for each row execute function record_sync_at_commit();
grant select, insert on sync_probe, sync_at_commit to {worker};
"""


def test_lossy_claim_leaves_the_batch_commit_durable(scratch: Scratch,
                                                     conn: psycopg.Connection) -> None:
    with scratch.connect("admin", "test defaults probe", autocommit=True) as admin:
        admin.execute(sql.SQL(SYNC_PROBE).format(worker=sql.Identifier(scratch.worker_role)))

    def probe(c: psycopg.Connection, job: Claim) -> None:
        c.execute("insert into sync_probe values (%s, current_setting('synchronous_commit'))",
                  (job.id,))

    with conn.transaction():
        ids = [enqueue(conn, "probe", tenant=1) for _ in range(6)]
    # Two batches of three: the first batch's transaction also claims the second batch.
    options = WorkerOptions(batch=3, batch_commit=True, lossy_claim=True, until_empty=True,
                            listen=False)
    with in_thread(Worker(scratch.worker, options, {"probe": probe})) as w:
        pass
    assert w.error is None, w.error
    assert [state(conn, i) for i in ids] == [("done", 1)] * 6
    seen = conn.execute("select p.job, in_handler, at_commit from sync_probe p "
                        "join sync_at_commit using (job) order by job").fetchall()
    assert seen == [(i, "on", "on") for i in ids], \
        "--lossy-claim made the batch's own commit (finishes and handler writes) lossy"


# 8 ------------------------------------------------------------------------------------------

def test_a_worker_claims_only_the_kinds_it_has_handlers_for(scratch: Scratch,
                                                             conn: psycopg.Connection) -> None:
    ran: list[int] = []
    with conn.transaction():
        mine = [enqueue(conn, "a", tenant=1) for _ in range(2)]
        theirs = enqueue(conn, "b", tenant=1)
    options = WorkerOptions(until_empty=True, listen=False, backoff=0)
    with in_thread(Worker(scratch.worker, options, {"a": lambda c, job: ran.append(job.id)})) as w:
        pass
    assert w.error is None, w.error
    assert ran == mine and [state(conn, i) for i in mine] == [("done", 1)] * 2
    # A rolling deploy: the new kind waits for a worker that has it, its attempts untouched.
    assert state(conn, theirs) == ("queued", 0), "a worker without the kind's handler burnt it"


def test_a_worker_without_handlers_refuses_to_start(scratch: Scratch,
                                                    conn: psycopg.Connection) -> None:
    with conn.transaction():
        job = enqueue(conn, "b", tenant=1)
    # --until-empty only so that a worker that starts anyway ends on its own.
    r = subprocess.run([sys.executable, "-m", "jobqueue", "worker", "--dsn",
                        scratch.worker, "--until-empty"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, f"exit {r.returncode}, job {state(conn, job)}: {r.stderr}"
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    with pytest.raises(ConfigError):
        Worker(scratch.worker, WorkerOptions(until_empty=True, listen=False), {}).run()
    assert state(conn, job) == ("queued", 0)


# 9 ------------------------------------------------------------------------------------------

# 10 -----------------------------------------------------------------------------------------

WORKER_GRANTS = """
grant usage on schema jobqueue to {worker};
grant select, insert, update, delete on jobqueue.jobs, jobqueue.job_runs to {worker};
grant select, update on jobqueue.claimable to {worker};
grant select on jobqueue.migrations to {worker};
grant select, insert, update on jobqueue.tenant_turns to {worker};
grant select, insert, update, delete on jobqueue.workers to {worker};
"""


def test_uuid_tenants_each_run_as_their_own_tenant(fresh_db: dict[str, str]) -> None:
    from jobqueue.migrations import migrate

    with psycopg.connect(fresh_db["admin"], autocommit=True) as c:
        c.execute(sql.SQL("set role {}").format(sql.Identifier(fresh_db["owner"])))
        assert migrate(c, tenant_type="uuid")
        c.execute(sql.SQL(WORKER_GRANTS).format(worker=sql.Identifier(fresh_db["worker_role"])))
    tenants = [uuid.uuid4() for _ in range(3)]
    seen: dict[int, tuple[Any, str]] = {}

    def whoami(c: psycopg.Connection, job: Claim) -> None:
        seen[job.id] = (job.tenant_id, c.execute("select current_setting('app.tenant')")
                        .fetchone()[0])

    with psycopg.connect(fresh_db["worker"], autocommit=True) as c:
        with c.transaction():
            ids = [enqueue(c, "whoami", tenant=t) for t in tenants]
        options = WorkerOptions(until_empty=True, listen=False)
        with in_thread(Worker(fresh_db["worker"], options, {"whoami": whoami})) as w:
            pass
        assert w.error is None, w.error
        jobs = c.execute("select id, status, attempts from jobqueue.jobs order by id").fetchall()
    assert jobs == [(i, "done", 1) for i in ids]
    assert seen == {i: (t, str(t)) for i, t in zip(ids, tenants, strict=True)}
