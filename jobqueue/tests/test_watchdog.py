"""jobqueue when a handler or the server misbehaves while a job runs (issue 31, the watchdog part):
a handler that never returns, a cancel then a retry of a running job, a heartbeat whose session
the server refuses, a handler that holds the GIL longer than the lease, a handler that forks.

Every case starts workers as a user would (``python -m jobqueue --handlers wd_jobs``, the
worker role with the README's grants) and counts executions in a file outside the database, so
a rollback cannot hide one. Waits only bound how long a test may take to see a behaviour.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Scratch
from psycopg import sql

from jobqueue import enqueue

WAIT = 30.0

HANDLERS = textwrap.dedent("""
    import os, sys, time
    from jobqueue import Handlers

    LOG = os.environ["WD_LOG"]

    def note(what, job):
        with open(LOG, "a") as f:
            f.write(f"{what} {job.id} {job.attempt} {os.getpid()} {time.time():.6f}\\n")

    def hangs(conn, job):
        # Never returns on the attempts the payload names, whatever cancelled() says.
        note("start", job)
        while job.attempt in job.payload.get("hang", []):
            time.sleep(0.05)
        note("end", job)

    def polite(conn, job):
        # Attempt 1 runs until cancelled, then until the test lets it go (the file `release`).
        note("start", job)
        if job.attempt == 1:
            while not job.cancelled() or not os.path.exists(LOG + ".release"):
                time.sleep(0.02)
        note("end", job)

    def quick(conn, job):
        note("start", job)
        conn.execute("insert into effects (job, attempt) values (%s, %s)", (job.id, job.attempt))
        note("end", job)

    def slow(conn, job):
        note("start", job)
        time.sleep(float(job.payload["seconds"]))
        note("end", job)

    def gil(conn, job):
        # Writes, then (attempt 1) holds the GIL in one C call for `hold` seconds: sum() over a
        # range never lets another thread run, as a long regex or C extension call would not.
        note("start", job)
        conn.execute("insert into effects (job, attempt) values (%s, %s)", (job.id, job.attempt))
        if job.attempt == 1:
            n = 1 << 20
            t = time.monotonic()
            sum(range(n))
            rate = n / max(time.monotonic() - t, 1e-6)
            sum(range(int(rate * float(job.payload["hold"]))))
        note("end", job)

    def forks(conn, job):
        note("start", job)
        pid = os.fork()
        if pid == 0:  # the child: ends with sys.exit(), not os._exit() (the rule broken)
            note("child", job)
            sys.exit(0)
        os.waitpid(pid, 0)
        conn.execute("insert into effects (job, attempt) values (%s, %s)", (job.id, job.attempt))
        note("end", job)

    handlers = Handlers({"polite": polite, "quick": quick, "slow": slow, "gil": gil,
                         "forks": forks})
    try:
        handlers.register("hangs", max_runtime=1.5)(hangs)  # its own limit, not the worker's
    except TypeError:  # a jobqueue before per-kind limits (the other cases still run on it)
        handlers.add("hangs", hangs)
""")


@dataclass
class Run:
    """One ``python -m jobqueue`` process, its stderr kept in a file."""

    proc: subprocess.Popen[bytes]
    err: Path

    def stderr(self) -> str:
        return self.err.read_text()


@dataclass
class Lab:
    """A scratch database, the handlers module, the executions log, the workers started."""

    s: Scratch
    home: Path
    log: Path
    env: dict[str, str]
    runs: list[Run] = field(default_factory=list)

    def worker(self, *flags: str) -> Run:
        err = self.home / f"worker{len(self.runs)}.err"
        with err.open("w") as stderr:  # the child has its own copy of the descriptor
            proc = subprocess.Popen([sys.executable, "-m", "jobqueue", "--handlers", "wd_jobs",
                                     *flags], cwd=self.home, env=self.env,
                                    stdout=subprocess.DEVNULL, stderr=stderr)
        run = Run(proc, err)
        self.runs.append(run)
        return run

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "jobqueue", *argv, "--dsn", self.s.worker],
                              cwd=self.home, env=self.env, capture_output=True, text=True,
                              timeout=WAIT)

    def lines(self, what: str | None = None) -> list[tuple[str, int, int, int, float]]:
        out = []
        for line in self.log.read_text().splitlines():
            w, job, attempt, pid, at = line.split()
            if what is None or w == what:
                out.append((w, int(job), int(attempt), int(pid), float(at)))
        return out

    def stderr(self) -> str:
        return "\n".join(r.stderr() for r in self.runs)


@pytest.fixture
def lab(scratch: Scratch, tmp_path: Path) -> Iterator[Lab]:
    (tmp_path / "wd_jobs.py").write_text(HANDLERS)
    log = tmp_path / "executions"
    log.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBQUEUE_", "PG"))}
    env.update(JOBQUEUE_DSN=scratch.worker, WD_LOG=str(log), PYTHONPATH=os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    with scratch.connect("owner", autocommit=True) as owner:
        owner.execute("create table effects (job bigint, attempt int)")
        owner.execute(sql.SQL("grant select, insert on effects to {}").format(
            sql.Identifier(scratch.worker_role)))
    lab = Lab(scratch, tmp_path, log, env)
    try:
        yield lab
    finally:
        for r in lab.runs:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
                r.proc.send_signal(signal.SIGTERM)  # at once: a hanging handler never ends
        for r in lab.runs:
            try:
                r.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()


@pytest.fixture
def conn(scratch: Scratch) -> Iterator[psycopg.Connection]:
    with scratch.connect("admin", "test watchdog", autocommit=True) as c:
        yield c


def wait_until(what: str, check: Callable[[], Any], lab: Lab, limit: float = WAIT) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"never saw {what}; workers said:\n{lab.stderr()}"
        time.sleep(0.05)


def job_state(conn: psycopg.Connection, job: int) -> tuple[str, int]:
    row = conn.execute("select status, attempts from jobqueue.jobs where id = %s",
                       (job,)).fetchone()
    assert row is not None
    return row[0], row[1]


def outcomes(conn: psycopg.Connection, job: int) -> list[tuple[int, str, str | None]]:
    return [tuple(r) for r in conn.execute(  # type: ignore[misc]
        "select attempt, outcome, error from jobqueue.job_runs where job_id = %s "
        "order by attempt, id", (job,)).fetchall()]


def exit_of(run: Run, lab: Lab, limit: float = WAIT) -> int:
    try:
        return run.proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker still runs after {limit:g} s; it said:\n{run.stderr()}")


# a. the watchdog ---------------------------------------------------------------------------------

def test_a_handler_that_never_returns_is_failed_at_its_maximum_runtime_and_the_worker_restarts(
        lab: Lab, conn: psycopg.Connection) -> None:
    """Before: the heartbeat kept the lease fresh for ever, nothing was logged, the job behind
    it never ran. Now: at the maximum runtime (the kind's own, 1.5 s, registered with its
    handler, instead of the worker's --max-runtime) the attempt is failed (counted, ERROR with the job,
    its tenant and its runtime); a lease later the worker ends (exit 4, where the handler is
    stuck) so that its supervisor starts a fresh one, which runs both jobs."""
    stuck = enqueue(conn, "hangs", tenant=7, payload={"hang": [1]})
    behind = enqueue(conn, "quick", tenant=7)
    first = lab.worker("--lease", "1", "--heartbeat", "0.25", "--max-runtime", "600",
                       "--no-listen")
    assert exit_of(first, lab) == 4
    err = first.stderr()
    assert f"job {stuck} (hangs, tenant 7) attempt 1 still running after" in err, err
    assert "ERROR" in err and "past its maximum runtime (1.5 s)" in err
    assert "in hangs" in err, "the stack of the stuck handler is logged"
    assert job_state(conn, stuck) == ("queued", 1)
    assert [(a, o) for a, o, _ in outcomes(conn, stuck)] == [(1, "failed")]
    assert "maximum runtime" in (outcomes(conn, stuck)[0][2] or "")
    assert job_state(conn, behind) == ("queued", 0)
    # The supervisor's fresh worker.
    again = lab.worker("--lease", "1", "--heartbeat", "0.25", "--until-empty", "--backoff", "0")
    assert exit_of(again, lab) == 0, again.stderr()
    assert job_state(conn, stuck) == ("done", 2) and job_state(conn, behind) == ("done", 1)


def test_stats_lists_a_running_job_whose_lease_ran_out(lab: Lab, conn: psycopg.Connection) -> None:
    job = enqueue(conn, "quick", tenant=3)
    conn.execute("update jobqueue.jobs set status = 'running', attempts = 1, locked_until = "
                 "clock_timestamp() - interval '90 seconds' where id = %s", (job,))
    done = lab.cli("stats", "--json")
    assert done.returncode == 0, done.stderr
    stale = json.loads(done.stdout)["lease_expired"]
    assert [(r["id"], r["tenant"], r["attempts"]) for r in stale] == [(job, "3", 1)]
    assert stale[0]["expired_s"] >= 90
    text = lab.cli("stats")
    assert "running jobs whose lease ran out" in text.stdout and "1m3" in text.stdout


# b. cancel, then retry, of a running job ---------------------------------------------------------

def test_a_job_cancelled_while_running_is_not_retried_beside_its_attempt(
        lab: Lab, conn: psycopg.Connection) -> None:
    """Before: the retry was queued at once and a second worker ran it while the cancelled
    attempt still ran (its heartbeat then took it for a lost lease, so the handler was never
    told). Now: the heartbeat stops extending the cancelled attempt, its handler sees
    cancelled(), its finish is fenced, and retry refuses until that attempt's end is recorded
    (or its lease runs out)."""
    job = enqueue(conn, "polite", tenant=1)
    for _ in range(2):
        lab.worker("--lease", "6", "--heartbeat", "0.5")
    wait_until("attempt 1 running", lambda: lab.lines("start"), lab)
    cancelled = lab.cli("cancel", str(job))
    assert cancelled.returncode == 0, cancelled.stderr
    refused = lab.cli("retry", str(job))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "still run" in refused.stderr
    (lab.log.parent / "executions.release").touch()  # the handler may return now
    wait_until("attempt 1 recorded", lambda: outcomes(conn, job), lab)
    retried = lab.cli("retry", str(job))
    assert retried.returncode == 0, retried.stderr
    wait_until("the retry done", lambda: job_state(conn, job)[0] == "done", lab)
    starts = {a: t for _, _, a, _, t in lab.lines("start")}
    ends = {a: t for _, _, a, _, t in lab.lines("end")}
    assert sorted(starts) == [1, 2] and ends[1] < starts[2], "two executions at once"
    assert [(a, o) for a, o, _ in outcomes(conn, job)] == [(1, "cancelled"), (2, "done")]


# c. the heartbeat's session refused ------------------------------------------------------------

def test_a_worker_whose_heartbeat_session_is_refused_runs_nothing_it_cannot_lease(
        lab: Lab, conn: psycopg.Connection) -> None:
    """The role may open one session: the worker gets its work session, not its heartbeat's.
    Before: it claimed and ran a 4 s job on a 1 s lease nobody extended (another worker would
    take it over: the trial saw a 15 s job run three times). Now: it opens its heartbeat's
    session before any claim and waits as in an outage while it is refused; once the limit is
    lifted the job runs, once."""
    role = sql.Identifier(lab.s.worker_role)
    conn.execute(sql.SQL("alter role {} connection limit 1").format(role))
    try:
        job = enqueue(conn, "slow", tenant=1, payload={"seconds": 4})
        run = lab.worker("--lease", "1", "--heartbeat", "0.3", "--backoff", "0")
        wait_until("the heartbeat's session refused, or the job running",
                   lambda: "heartbeat's session" in lab.stderr() or lab.lines(), lab)
        time.sleep(1.5)  # room for a claim that must not be made
        ran_unleased = lab.lines("start")
    finally:
        conn.execute(sql.SQL("alter role {} connection limit -1").format(role))
    assert not ran_unleased, f"ran while its lease could not be extended: {ran_unleased}"
    assert "too many connections" in run.stderr()
    wait_until("the job done", lambda: job_state(conn, job)[0] == "done", lab)
    assert len(lab.lines("start")) == 1 and job_state(conn, job) == ("done", 1)


# d. a handler that holds the GIL longer than the lease ------------------------------------------

def test_a_handler_holding_the_gil_past_the_lease_is_named_and_its_writes_fenced(
        lab: Lab, conn: psycopg.Connection) -> None:
    """The rule: no call in a handler may hold the GIL longer than the lease. Broken, the
    heartbeat cannot beat, the lease runs out and another worker runs the job again; the
    starved heartbeat says so at ERROR (before: nothing), and the fence keeps the late
    attempt's write out: one row in effects for two executions."""
    job = enqueue(conn, "gil", tenant=1, payload={"hold": 4})
    for _ in range(2):
        lab.worker("--lease", "1", "--heartbeat", "0.25", "--poll", "0.2")
    wait_until("both attempts recorded", lambda: len(outcomes(conn, job)) == 2, lab)
    wait_until("the starved heartbeat's ERROR", lambda: "holding the GIL" in lab.stderr(), lab,
               limit=5)
    assert [a for _, _, a, _, _ in lab.lines("start")] == [1, 2]
    assert conn.execute("select attempt from effects").fetchall() == [(2,)]
    assert [(a, o) for a, o, _ in outcomes(conn, job)] == [(1, "fenced"), (2, "done")]


# e. a handler that forks -------------------------------------------------------------------------

def test_a_forked_child_that_exits_does_not_touch_the_workers_sessions(
        lab: Lab, conn: psycopg.Connection) -> None:
    """A handler's child that ends with sys.exit() (not os._exit()) came back into the worker's
    code and used the parent's sessions. Now it ends at once: the parent's job and the one
    after it finish on their connection, nothing is "lost"."""
    forked = enqueue(conn, "forks", tenant=1)
    after = enqueue(conn, "quick", tenant=1)
    run = lab.worker("--until-empty", "--no-listen")
    assert exit_of(run, lab) == 0, run.stderr()
    assert "lost the server" not in run.stderr() and "Traceback" not in run.stderr(), run.stderr()
    assert len(lab.lines("child")) == 1
    assert job_state(conn, forked) == ("done", 1) and job_state(conn, after) == ("done", 1)
    assert sorted(conn.execute("select job from effects").fetchall()) == [(forked,), (after,)]
