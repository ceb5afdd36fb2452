"""The heartbeat: validation, extending only its own attempt's lease, stopping at the maximum runtime."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
from jobqueue.heartbeat import Heartbeat, HeartbeatConfig, HeartbeatError, check

from tenantlab import db, queue
from tenantlab.events import NullLog
from tenantlab.queries import q


class Recorder(NullLog):
    """An event log that keeps what it is told, for assertions."""

    def __init__(self) -> None:
        super().__init__("test")
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def emit(self, event: str, **fields: Any) -> None:
        self.seen.append((event, fields))

    def names(self) -> list[str]:
        return [e for e, _ in self.seen]


def _until(done: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.parametrize(("lease", "interval", "max_runtime", "says"), [
    (2.0, 2.0, None, "must be shorter than the lease (2 s)"),
    (2.0, 3.5, None, "otherwise the lease expires between two beats"),
    (2.0, 0.0, None, "must be a positive number of seconds"),
    (2.0, -1.0, None, "must be a positive number of seconds"),
    (2.0, 0.5, 0.0, "maximum runtime must be a positive number"),
    (2.0, None, 4.0, "a maximum runtime needs a heartbeat"),
])
def test_bad_heartbeat_is_refused_with_the_reason(lease: float, interval: float | None,
                                                  max_runtime: float | None, says: str) -> None:
    with pytest.raises(HeartbeatError, match=says.replace("(", r"\(").replace(")", r"\)")):
        check(lease, interval, max_runtime)
    if interval:  # 0 is the production worker's "off", not an interval
        with pytest.raises(HeartbeatError):
            queue.Leased(lease=lease, heartbeat=interval, max_runtime=max_runtime)


def test_good_heartbeat_is_accepted() -> None:
    config = HeartbeatConfig(lease=2.0, interval=0.5, max_runtime=4.0)
    assert config.interval < config.lease
    leased = queue.Leased(lease=2.0, heartbeat=0.5, max_runtime=4.0)
    assert leased.beat == config and leased.fence


def test_single_design_refuses_lease_options() -> None:
    with pytest.raises(queue.QueueError, match="need the leased design"):
        queue.design("single", heartbeat=0.5)
    with pytest.raises(queue.QueueError, match="need the leased design"):
        queue.design("single", fence=False)


def test_worker_cli_refuses_a_heartbeat_not_shorter_than_the_lease() -> None:
    out = subprocess.run([sys.executable, "-m", "tenantlab", "worker", "--lease", "2",
                          "--heartbeat", "2", "--dsn", "postgresql:///nowhere"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "must be shorter than the lease (2 s)" in out.stderr


def _claim(conn: Any, lease: float) -> queue.Claim:
    claim = queue.Leased(lease=lease).claim(conn)
    assert claim is not None
    return claim


def _locked_until(conn: Any, job: int) -> Any:
    return next(s["locked_until"] for s in queue.job_states(conn) if s["id"] == job)


def test_heartbeat_extends_its_own_lease_and_stops_with_the_block(scratch: db.Scratch) -> None:
    with scratch.connect("worker", "hb test", autocommit=True) as conn:
        (job,) = queue.enqueue(conn, "sleep", tenant=1, seconds=1)
        claim = _claim(conn, lease=2.0)
        before = _locked_until(conn, job)
        events = Recorder()
        with Heartbeat(scratch.worker, claim, HeartbeatConfig(2.0, 0.1), events=events) as beat:
            _until(lambda: beat.beats >= 3)
        beats = beat.beats
        assert _locked_until(conn, job) > before
        assert not beat.lost and not beat.abandoned
        time.sleep(0.3)
        assert beat.beats == beats, "the heartbeat went on after the job ended"
        assert events.names().count("heartbeat") == beats


def test_heartbeat_cannot_extend_another_attempts_lease(scratch: db.Scratch) -> None:
    with scratch.connect("worker", "hb test", autocommit=True) as conn:
        (job,) = queue.enqueue(conn, "sleep", tenant=1, seconds=1)
        first = _claim(conn, lease=0.2)
        _until(lambda: conn.execute(q("eligible_leased")).fetchall() != [])
        second = _claim(conn, lease=30.0)  # the lease expired: attempt 2 owns the job now
        assert (second.id, second.attempt) == (job, 2)
        owned = _locked_until(conn, job)
        # The query itself: the guard in its WHERE clause leaves attempt 2's row alone.
        assert conn.execute(q("heartbeat_if_owner"),
                            {"id": job, "attempt": 1, "lease": 60.0}).fetchone() is None
        assert _locked_until(conn, job) == owned
        events = Recorder()
        with Heartbeat(scratch.worker, first, HeartbeatConfig(0.5, 0.05), events=events) as beat:
            _until(lambda: beat.lost)
        assert beat.beats == 0
        assert events.names() == ["lease-lost"]
        assert _locked_until(conn, job) == owned
        state = next(s for s in queue.job_states(conn) if s["id"] == job)
        assert (state["status"], state["attempts"]) == ("running", 2)


def test_heartbeat_stops_at_the_maximum_runtime(scratch: db.Scratch) -> None:
    with scratch.connect("worker", "hb test", autocommit=True) as conn:
        (job,) = queue.enqueue(conn, "sleep", tenant=1, seconds=1)
        claim = _claim(conn, lease=1.0)
        events = Recorder()
        config = HeartbeatConfig(lease=1.0, interval=0.1, max_runtime=0.6)
        with Heartbeat(scratch.worker, claim, config, events=events) as beat:
            _until(lambda: beat.abandoned)
            beats = beat.beats
            last = _locked_until(conn, job)
            time.sleep(0.4)  # the job "still runs": no beat may follow the abandonment
            assert beat.beats == beats
            assert _locked_until(conn, job) == last
        assert not beat.lost
        assert events.names()[-1] == "abandon"
        # The lease now runs out; then the claim may take the job again.
        _until(lambda: job in [r[0] for r in conn.execute(q("eligible_leased"))])


def test_leased_design_beats_while_the_work_runs(scratch: db.Scratch) -> None:
    with scratch.connect("worker", "hb test", autocommit=True) as conn:
        queue.enqueue(conn, "sleep", tenant=1, seconds=0.6)
        events = Recorder()
        outcome = queue.Leased(lease=2.0, heartbeat=0.1).run_one(conn, worker="w", events=events)
        assert outcome is not None and outcome.status == "done"
        names = events.names()
        assert "heartbeat" in names
        # Every beat falls between the execution's start and its finish.
        assert names.index("execute") < names.index("heartbeat")
        assert max(i for i, n in enumerate(names) if n == "heartbeat") < names.index("finish")
