"""The two queue designs behind one interface, in process: poison, backoff, fencing, reaper.

One test body runs against both designs; where the single-transaction design is meant to fail,
the test is marked xfail(strict=True) with the anomaly's name.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from jobqueue import Reaper, ReaperConfig

from tenantlab import db, kinds, queue, tenant
from tenantlab.events import EventLog
from tenantlab.queries import q


class Recorded(EventLog):
    """An event log that keeps its events in a list."""

    def __init__(self) -> None:
        self.worker, self.pid, self._fd, self._stream = "test", 0, None, None
        self.lines: list[dict[str, Any]] = []

    def emit(self, event: str, **fields: Any) -> None:
        self.lines.append({"event": event, "t": time.time(), **fields})


@pytest.fixture
def conn(scratch: db.Scratch):
    with scratch.connect("worker", "test queue", autocommit=True) as c:
        yield c


def states(conn: psycopg.Connection) -> dict[int, dict[str, Any]]:
    return {s["id"]: s for s in queue.job_states(conn)}


def wait_until_eligible(conn: psycopg.Connection, job: int, timeout: float = 30.0) -> None:
    """Poll the leased claim's own condition: behaviour, not a fixed sleep."""
    deadline = time.monotonic() + timeout
    while job not in [r[0] for r in conn.execute(q("eligible_leased"))]:
        assert time.monotonic() < deadline, f"job {job} never became eligible"
        time.sleep(0.02)


NAIVE = "single"
DESIGNS = {
    "single": lambda: queue.SingleTransaction(),
    "leased": lambda: queue.Leased(lease=30, backoff=0),
}


@pytest.mark.parametrize("design", [
    pytest.param("single", marks=pytest.mark.xfail(
        strict=True, reason="poison: the rollback takes the attempt count with it; the failing "
                            "job is first in line every time and the job behind it never runs")),
    "leased",
])
def test_poison_job_dies_after_max_attempts_and_the_queue_moves_on(conn, design: str) -> None:
    poison = queue.enqueue(conn, "fail", tenant=1)[0]
    behind = queue.enqueue(conn, "count", tenant=2)[0]
    d = DESIGNS[design]()
    outcomes = []
    for _ in range(10):
        outcome = d.run_one(conn)
        if outcome is None:
            break
        outcomes.append(outcome)
    s = states(conn)
    assert s[behind]["status"] == "done"
    assert s[poison]["status"] == "dead"
    assert s[poison]["attempts"] == 3
    # A failed job is retried after the jobs that were ready before it failed (by ready time).
    assert sorted(o.claim.id for o in outcomes) == [poison] * 3 + [behind]


def test_single_transaction_without_handler_never_counts(conn) -> None:
    poison = queue.enqueue(conn, "fail", tenant=1)[0]
    queue.enqueue(conn, "count", tenant=2)
    d = queue.SingleTransaction()
    picked = [d.run_one(conn) for _ in range(10)]
    assert [o.claim.id for o in picked] == [poison] * 10
    assert {o.status for o in picked} == {"failed"}
    s = states(conn)[poison]
    assert (s["status"], s["attempts"], s["runs"]) == ("queued", 0, 0)


def test_single_transaction_error_handler_counts_in_a_new_transaction(conn) -> None:
    poison = queue.enqueue(conn, "fail", tenant=1)[0]
    behind = queue.enqueue(conn, "count", tenant=2)[0]
    d = queue.SingleTransaction(handle_errors=True)
    statuses = [d.run_one(conn).status for _ in range(4)]
    assert statuses == ["queued", "queued", "dead", "done"]
    s = states(conn)
    assert (s[poison]["status"], s[poison]["attempts"]) == ("dead", 3)
    assert s[behind]["status"] == "done"
    assert d.run_one(conn) is None


@pytest.mark.parametrize("design", [
    pytest.param("single", marks=pytest.mark.xfail(
        strict=True, reason="backoff: a failed job is straight back at the head of the queue, "
                            "retries follow each other at once")),
    "leased",
])
def test_failed_job_waits_before_its_retry(conn, design: str) -> None:
    job = queue.enqueue(conn, "fail", tenant=1)[0]
    d = (queue.SingleTransaction(handle_errors=True) if design == "single"
         else queue.Leased(lease=30, backoff=60))
    assert d.run_one(conn).status == "queued"
    again = d.run_one(conn)
    assert again is None, f"job {job} retried at once, attempt {again.claim.attempt}"
    assert states(conn)[job]["attempts"] == 1


def test_backoff_grows_with_attempts_with_jitter(conn) -> None:
    job = queue.enqueue(conn, "fail", tenant=1, max_attempts=3)[0]
    d = queue.Leased(lease=30, backoff=0.2)
    log = Recorded()
    for _ in range(3):
        wait_until_eligible(conn, job)
        assert d.run_one(conn, events=log).claim.id == job
    fails = [e for e in log.lines if e["event"] == "fail"]
    assert [f["attempt"] for f in fails] == [1, 2, 3]
    delays = [(f["run_after"] - datetime.fromtimestamp(f["t"], UTC)).total_seconds()
              for f in fails[:2]]
    # base * 2^(attempt-1) * 0.75..1.25, read back from the rows; small slack for two clocks.
    assert 0.15 - 0.05 <= delays[0] <= 0.25 + 0.05
    assert 0.30 - 0.05 <= delays[1] <= 0.50 + 0.05
    assert states(conn)[job]["status"] == "dead"


def test_fencing_rejects_a_stale_attempt(scratch: db.Scratch, conn) -> None:
    job = queue.enqueue(conn, "count", tenant=3)[0]
    stale = queue.Leased(lease=0.05).claim(conn)
    assert stale is not None and stale.attempt == 1
    wait_until_eligible(conn, job)
    with scratch.connect("worker", "test queue 2", autocommit=True) as other:
        current = queue.Leased(lease=30).claim(other)
        assert current is not None and (current.id, current.attempt) == (job, 2)
        log = Recorded()
        late = queue.Leased(lease=30).execute(conn, stale, events=log)
        assert late.status == "fenced"
        # Its lease ran out before its start: not started at all (the start is fenced too).
        assert [(e["event"], e.get("step")) for e in log.lines] == [("fenced", "start")]
        assert states(conn)[job]["runs"] == 0
        assert queue.Leased().fail(conn, stale, RuntimeError("late")).status == "fenced"
        done = queue.Leased(lease=30).execute(other, current)
    assert (done.status, done.result) == ("done", 6666)
    s = states(conn)[job]
    assert (s["status"], s["attempts"], s["runs"]) == ("done", 2, 1)


def test_a_late_finish_is_fenced_and_everything_it_wrote_rolls_back(scratch: db.Scratch,
                                                                    conn) -> None:
    job = queue.enqueue(conn, "count", tenant=3, write=True)[0]
    first = queue.Leased(lease=30).claim(conn)
    taken: list[queue.Outcome] = []

    def overrun(c, claim):
        kinds.write_first(c, claim)  # the late attempt writes, then outlives its lease
        with scratch.connect("admin", "expire") as admin:
            admin.execute("update jobs set locked_until = clock_timestamp() - interval '1 s' "
                          "where id = %s", (claim.id,))
        with scratch.connect("worker", "test queue 2", autocommit=True) as other:
            d = queue.Leased(lease=30)
            taken.append(d.execute(other, d.claim(other), kinds.write_first))
        return 0

    log = Recorded()
    late = queue.Leased(lease=30).execute(conn, first, overrun, events=log)
    assert (late.status, taken[0].status) == ("fenced", "done")
    assert [(e["event"], e.get("step")) for e in log.lines] == [("execute", None),
                                                              ("fenced", "complete")]
    s = states(conn)[job]
    assert (s["status"], s["attempts"], s["runs"]) == ("done", 2, 1)
    # The late attempt's write rolled back with its fenced finish; the new attempt's stands.
    assert conn.execute("select attempt from job_writes where job_id = %s",
                        (job,)).fetchall() == [(2,)]


@pytest.mark.parametrize("design", ["single", "leased"])
def test_tenant_is_set_locally_and_ends_with_the_job(conn, design: str) -> None:
    queue.enqueue(conn, "count", tenant=1)
    queue.enqueue(conn, "fail", tenant=2)
    d = DESIGNS[design]()
    assert d.run_one(conn).result == 20000
    assert tenant.current_tenant(conn) is None
    d.run_one(conn)
    assert tenant.current_tenant(conn) is None
    assert conn.execute(q("count_invoices")).fetchone()[0] == 0


def test_reaper_marks_exhausted_expired_jobs_dead_and_leaves_the_rest(conn) -> None:
    exhausted = queue.enqueue(conn, "sleep", tenant=1, max_attempts=1)[0]
    expired = queue.enqueue(conn, "sleep", tenant=2, max_attempts=3)[0]
    alive = queue.enqueue(conn, "sleep", tenant=3, max_attempts=1)[0]
    short = queue.Leased(lease=0.05)
    assert short.claim(conn).id == exhausted
    assert short.claim(conn).id == expired
    assert queue.Leased(lease=300).claim(conn).id == alive
    wait_until_eligible(conn, expired)  # both short leases have expired now
    s = states(conn)
    assert s[exhausted]["status"] == "running" and s[exhausted]["lease_expired"]
    log = Recorded()
    # By default the reaper gives a lease 30 s of grace: a late but live worker is not dead yet.
    assert Reaper(conn, ReaperConfig(), log).run_once() == []
    reaped = Reaper(conn, ReaperConfig(grace=0), log).run_once()
    assert [(r["id"], r["status"]) for r in reaped] == [(exhausted, "dead")]
    assert [e["event"] for e in log.lines] == ["reap"]
    s = states(conn)
    assert [s[i]["status"] for i in (exhausted, expired, alive)] == ["dead", "running", "running"]
    requeued = Reaper(conn, ReaperConfig(grace=0, requeue=True)).run_once()
    assert [(r["id"], r["status"]) for r in requeued] == [(expired, "queued")]
    assert states(conn)[alive]["status"] == "running"  # its lease is still valid
    assert Reaper(conn).run_once() == []


def test_options_say_what_is_valid() -> None:
    with pytest.raises(queue.QueueError, match="lease must be a positive number of seconds"):
        queue.Leased(lease=0)
    with pytest.raises(queue.QueueError, match="valid: single, leased"):
        queue.design("fifo")
    with pytest.raises(ValueError, match="batch must be at least 1"):
        ReaperConfig(batch=0)


def test_unknown_kind_is_refused_at_enqueue(conn) -> None:
    with pytest.raises(queue.QueueError, match="valid: count, sleep, fail, crash"):
        queue.enqueue(conn, "email")
