"""jobqueue under a production engineer's faults (issue 31, items 2, 5 and 6 and the operator's
commands): an online upgrade (migrate with a lock timeout; a worker that refuses a schema newer
than it knows), slots from the server's clock, a periodic check that fails with a job in hand,
the preflight's grants and schedules, and retry, enqueue, enqueue_many and a closed pipe.

Each runs the real path: a worker or the command line in a subprocess, as the README's worker
role. A worker's clock is faked in its own process only (``sitecustomize`` below, put on the
child's path by the test; the product has no hook for it)."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import HERE, Scratch
from psycopg import sql

from jobqueue import Job, enqueue, enqueue_many, migrations

PROG = [sys.executable, "-m", "jobqueue"]
WAIT = 60.0

# Put on a child's path by the tests that fake its clock or shorten its schema check: only
# there, only when the variables are set.
SITECUSTOMIZE = """
    import os
    if os.environ.get("JQ_TEST_CLOCK_SKEW"):
        import time
        _skew, _time, _time_ns = float(os.environ["JQ_TEST_CLOCK_SKEW"]), time.time, time.time_ns
        time.time = lambda: _time() + _skew
        time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
        import datetime as _dt
        _real = _dt.datetime

        class _SkewedDatetime(_dt.datetime):
            @classmethod
            def now(cls, tz=None):
                return _real.fromtimestamp(time.time(), tz)

        _dt.datetime = _SkewedDatetime  # for the modules imported after this one
    if os.environ.get("JQ_TEST_SCHEMA_CHECK"):
        import jobqueue.worker
        jobqueue.worker.SCHEMA_CHECK = float(os.environ["JQ_TEST_SCHEMA_CHECK"])
"""

MODULES = {
    "sitecustomize": SITECUSTOMIZE,
    # A periodic job every minute.
    "minutely_handlers": """
        from jobqueue import Handlers, Schedules
        handlers = Handlers({"noop": lambda conn, job: None})
        schedules = Schedules()
        schedules.add("tick", "noop", tenant=1, every=60)
    """,
    # A schedule whose tenant is not a bigint, beside a good one.
    "bad_schedule_handlers": """
        from jobqueue import Handlers, Schedules
        handlers = Handlers({"noop": lambda conn, job: None})
        schedules = Schedules()
        schedules.add("acme-nightly", "noop", tenant="acme", cron="0 3 * * *")
        schedules.add("good", "noop", tenant=1, every=3600)
    """,
    # Job "first" takes its grant on jobqueue.periodic away from the worker while it runs: the
    # periodic check right after its finish (which claimed "second") fails.
    "revoking_handlers": """
        import os, time
        import psycopg
        from jobqueue import Handlers, Schedules

        def revoke(conn, job):
            time.sleep(1.2)  # the next periodic slot (every second) comes meanwhile
            with psycopg.connect(os.environ["JQ_TEST_ADMIN"], autocommit=True) as admin:
                admin.execute("revoke insert, update on jobqueue.periodic from "
                              + os.environ["JQ_TEST_ROLE"])

        handlers = Handlers({"first": revoke, "second": lambda conn, job: None,
                             "noop": lambda conn, job: None})
        schedules = Schedules()
        schedules.add("every-second", "noop", tenant=1, every=1)
    """,
}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    return tmp_path


def env(home: Path, **extra: str) -> dict[str, str]:
    paths = [str(home), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **extra)


def cli(home: Path, *argv: str, timeout: float = WAIT, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PROG, *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=home, env=env(home, **extra))


@pytest.fixture
def conn(scratch: Scratch) -> Iterator[psycopg.Connection]:
    with scratch.connect("worker", "test online", autocommit=True) as c:
        yield c


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text, text
    return lines[0]


def stop(child: subprocess.Popen) -> tuple[str, str]:
    """End a child the test started (if it still runs); return what it wrote."""
    child.kill()
    return child.communicate()


def status(conn: psycopg.Connection, job: int) -> str:
    row = conn.execute("select status from jobqueue.jobs where id = %s", (job,)).fetchone()
    assert row is not None
    return str(row[0])


# -- item 5: online upgrades -------------------------------------------------------------------

def migrate_up_to(admin: str, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Install the schema as an older package would: the migrations up to `version` only."""
    with psycopg.connect(admin, autocommit=True) as c:
        older = [m for m in migrations.available() if m[0] <= version]
        monkeypatch.setattr(migrations, "available", lambda: older)
        migrations.migrate(c)
        monkeypatch.undo()


def test_migrate_behind_a_running_job_never_holds_enqueues_longer_than_its_lock_timeout(
        fresh_db: dict[str, str], home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed at 0002, a job's transaction open on jobqueue.jobs: `migrate` (0003 alters
    jobs) waits at most its lock timeout per try, so the application's enqueue goes through
    while the job still runs; it gives up in one line, changes nothing, and applies once the
    job is done. Before: it waited for the job, and every enqueue waited behind it."""
    admin = fresh_db["admin"]
    migrate_up_to(admin, 2, monkeypatch)
    job = psycopg.connect(admin, application_name="test running job")  # a job's transaction
    job.execute("select count(*) from jobqueue.jobs")
    migrate = subprocess.Popen([*PROG, "migrate", "--dsn", admin, "--lock-timeout", "0.5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=home, env=env(home))
    try:
        with psycopg.connect(admin, autocommit=True) as app:
            deadline = time.monotonic() + WAIT
            while not app.execute("select 1 from pg_stat_activity where application_name = "
                                  "'jobqueue migrate' and wait_event_type = 'Lock'").fetchone():
                assert migrate.poll() is None and time.monotonic() < deadline, \
                    migrate.communicate()
                time.sleep(0.02)
            # The old application's enqueue, queued behind migrate's lock request.
            app.execute("set statement_timeout = '15s'")
            app.execute("insert into jobqueue.jobs (tenant_id, kind) values (1, 'x')")
            assert job.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        out, err = migrate.communicate(timeout=WAIT)
    finally:
        stop(migrate)
        job.close()
    assert migrate.returncode == 1, err
    line = one_line(err.split("trying again (4 of 5)")[-1])
    assert "could not lock jobqueue's tables within 0.5 s, 5 times" in line
    assert "test running job" in line and "nothing was changed" in line
    done = cli(home, "migrate", "--dsn", admin)
    assert done.returncode == 0 and "applied 0003_routing" in done.stdout, done.stderr


def test_migrate_builds_its_indexes_while_enqueues_go_on_and_repairs_a_stopped_build(
        fresh_db: dict[str, str], home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed at 0003; an application's transaction has written to jobqueue.tenant_turns
    and is still open, so 0004's build of the turns' index waits for it (as any build waits
    for the writers of its table). Meanwhile the application enqueues, under a lock timeout of
    its own: it goes through. A stopped build (cancelled) leaves an invalid index; the next
    migrate builds it again and ends with both indexes valid. Before: 0004 dropped and rebuilt
    jobs' index in its transaction, holding the table's strongest lock while it waited and
    built: the enqueue timed out."""
    admin = fresh_db["admin"]
    migrate_up_to(admin, 3, monkeypatch)
    writer = psycopg.connect(admin, application_name="test turns writer")
    writer.execute("insert into jobqueue.tenant_turns (tenant_id, last_served) values (7, 'infinity')")
    try:
        with psycopg.connect(admin, autocommit=True) as app:
            for attempt in (1, 2):
                migrate = subprocess.Popen([*PROG, "migrate", "--dsn", admin], text=True,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           cwd=home, env=env(home))
                try:
                    deadline = time.monotonic() + WAIT
                    while not (pid := app.execute(
                            "select pid from pg_stat_activity where application_name = "
                            "'jobqueue migrate' and wait_event_type = 'Lock'").fetchone()):
                        assert migrate.poll() is None and time.monotonic() < deadline, \
                            migrate.communicate()
                        time.sleep(0.02)
                    app.execute("set lock_timeout = '1s'")
                    app.execute("insert into jobqueue.jobs (tenant_id, kind) values (1, 'x')")
                    app.execute("reset lock_timeout")
                    if attempt == 1:  # stopped half way: the turns' index is left invalid
                        app.execute("select pg_cancel_backend(%s)", pid)
                        _, err = migrate.communicate(timeout=WAIT)
                        assert migrate.returncode != 0, err
                        assert app.execute(
                            "select not indisvalid from pg_index where indexrelid = "
                            "'jobqueue.tenant_turns_in_turn'::regclass").fetchone() == (True,)
                        continue
                    writer.commit()
                    out, err = migrate.communicate(timeout=WAIT)
                finally:
                    stop(migrate)
    finally:
        writer.close()
    assert migrate.returncode == 0 and "applied 0004_claim_plans" in out, err
    assert "left invalid by a build that stopped" in err
    with psycopg.connect(admin, autocommit=True) as c:
        indexes = dict(c.execute(
            "select c.relname, i.indisvalid from pg_index i join pg_class c on c.oid = "
            "i.indexrelid where c.relnamespace = 'jobqueue'::regnamespace and c.relname in "
            "('jobs_claimable_by_tenant', 'jobs_claimable_by_tenant_0004', "
            "'tenant_turns_in_turn')").fetchall())
        assert indexes == {"jobs_claimable_by_tenant": True, "tenant_turns_in_turn": True}
        assert "tenant_id IS NOT NULL" in c.execute(
            "select pg_get_indexdef('jobqueue.jobs_claimable_by_tenant'::regclass)").fetchone()[0]
        assert c.execute("select count(*) from jobqueue.jobs").fetchone() == (2,)


def test_a_worker_refuses_a_schema_newer_than_it_knows_and_a_running_one_stops(
        scratch: Scratch, home: Path, conn: psycopg.Connection) -> None:
    """A newer version migrated the schema: a running worker stops (exit 2, one line) instead
    of claiming by rules it does not know; a new one refuses to start."""
    worker = subprocess.Popen([*PROG, "--handlers", "noop_handlers", "--dsn", scratch.worker,
                               "--poll", "0.2"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=home,
                              env=env(home, JQ_TEST_SCHEMA_CHECK="0.3"))
    try:
        deadline = time.monotonic() + WAIT
        while not conn.execute("select 1 from jobqueue.workers").fetchone():
            assert worker.poll() is None and time.monotonic() < deadline, \
                stop(worker)
            time.sleep(0.05)
        with scratch.connect("owner", autocommit=True) as owner:
            owner.execute("insert into jobqueue.migrations (version, name) values (%s, %s)",
                          (migrations.latest() + 1, f"{migrations.latest() + 1:04d}_future"))
        _, err = worker.communicate(timeout=WAIT)
    finally:
        stop(worker)
    assert worker.returncode == 2, err
    assert f"newer than this worker knows ({migrations.latest()})" in one_line(err)
    started = cli(home, "--handlers", "noop_handlers", "--dsn", scratch.worker)
    assert started.returncode == 2
    assert "newer than this worker knows" in one_line(started.stderr)


# -- item 6: time from the database ------------------------------------------------------------

def test_a_worker_an_hour_fast_enqueues_the_slot_of_the_servers_clock(
        scratch: Scratch, home: Path, conn: psycopg.Connection) -> None:
    """The worker's host clock one hour ahead (faked in its process): it enqueues the slot the
    server's clock is in, and records no future slot that would hold the schedule back for
    every other worker. Before: the slot an hour ahead, enqueued early."""
    conn.execute("insert into jobqueue.periodic (name, last_slot) values ('tick', "
                 "to_timestamp(floor(extract(epoch from now()) / 60) * 60 - 60))")
    done = cli(home, "--handlers", "minutely_handlers", "--dsn", scratch.worker, "--until-empty",
               JQ_TEST_CLOCK_SKEW="3600")
    assert done.returncode == 0, done.stderr
    ahead, key = conn.execute(
        "select extract(epoch from p.last_slot - now()), j.unique_key from jobqueue.periodic p "
        "left join jobqueue.jobs j on j.kind = 'noop' where p.name = 'tick'").fetchone()
    assert ahead <= 0, f"recorded a slot {ahead:.0f} s in the server's future ({key})"
    assert key is not None and key.startswith("periodic:tick@"), key


def test_the_operators_ages_follow_the_servers_clock(scratch: Scratch, home: Path,
                                                    conn: psycopg.Connection) -> None:
    """`show` on a host an hour fast: the job was created seconds ago, not an hour."""
    job = enqueue(conn, "noop", tenant=1)
    done = cli(home, "show", str(job), "--dsn", scratch.worker, JQ_TEST_CLOCK_SKEW="3600")
    assert done.returncode == 0, done.stderr
    created = re.search(r"created (\S+) ago", done.stdout)
    assert created and re.fullmatch(r"[0-9.]+s", created.group(1)), done.stdout


# -- a periodic check that fails with a job in hand --------------------------------------------

def test_a_periodic_check_failing_after_a_finish_still_runs_the_job_it_claimed(
        scratch: Scratch, home: Path, conn: psycopg.Connection, admin_dsn: str) -> None:
    """"first"'s finish claims "second" (one commit); the periodic check then fails (its grant
    revoked). Before: "second" was dropped while the heartbeat kept its lease, `running` for
    the worker's life. Now it runs; the error, persisting, stops the worker (exit 2)."""
    first = enqueue(conn, "first", tenant=1)
    second = enqueue(conn, "second", tenant=1)
    done = cli(home, "--handlers", "revoking_handlers", "--dsn", scratch.worker, "--until-empty",
               JQ_TEST_ADMIN=scratch.admin, JQ_TEST_ROLE=scratch.worker_role)
    assert "permission denied for table periodic" in done.stderr, done.stderr
    assert (status(conn, first), status(conn, second)) == ("done", "done"), done.stderr


# -- item 2: the preflight checks every grant and every schedule ---------------------------------

def test_the_preflight_checks_the_periodic_and_round_robin_grants(
        scratch: Scratch, home: Path) -> None:
    with scratch.connect("owner", autocommit=True) as owner:
        owner.execute(sql.SQL("revoke update on jobqueue.periodic, jobqueue.tenant_turns "
                              "from {}").format(sql.Identifier(scratch.worker_role)))
    done = cli(home, "--handlers", "minutely_handlers", "--dsn", scratch.worker, "--until-empty")
    assert done.returncode == 2
    assert "lacks update on jobqueue.periodic" in one_line(done.stderr)
    done = cli(home, "--handlers", "noop_handlers", "--dsn", scratch.worker, "--until-empty",
               "--fair", "round-robin")
    assert done.returncode == 2
    assert "lacks update on jobqueue.tenant_turns" in one_line(done.stderr)
    # A worker without schedules nor --fair round-robin needs neither.
    done = cli(home, "--handlers", "noop_handlers", "--dsn", scratch.worker, "--until-empty")
    assert done.returncode == 0, done.stderr


def test_a_schedule_with_a_tenant_of_the_wrong_type_is_skipped_not_a_stop(
        scratch: Scratch, home: Path, conn: psycopg.Connection) -> None:
    """'acme' on a bigint install: logged at ERROR once and skipped; the jobs run. Before: the
    worker claimed nothing and stopped."""
    job = enqueue(conn, "noop", tenant=1)
    done = cli(home, "--handlers", "bad_schedule_handlers", "--dsn", scratch.worker,
               "--until-empty")
    assert done.returncode == 0, done.stderr
    assert status(conn, job) == "done"
    errors = [line for line in done.stderr.splitlines() if "acme-nightly" in line]
    assert len(errors) == 1 and "skipped" in errors[0] and "'acme'" in errors[0], done.stderr


# -- the operator's commands -------------------------------------------------------------------

def test_retry_dead_queues_the_rest_and_says_which_unique_keys_are_taken(
        scratch: Scratch, home: Path, conn: psycopg.Connection) -> None:
    keyed = enqueue(conn, "noop", tenant=1, unique_key="report-1", max_attempts=1)
    plain = enqueue(conn, "noop", tenant=1, max_attempts=1)
    conn.execute("update jobqueue.jobs set status = 'dead', attempts = 1 where id in (%s, %s)",
                 (keyed, plain))
    live = enqueue(conn, "noop", tenant=1, unique_key="report-1")  # the key is free: a new job
    done = cli(home, "retry", "--dead", "--dsn", scratch.worker)
    assert done.returncode == 0, done.stderr
    assert f"job {keyed} (noop, tenant 1) left dead: its unique key 'report-1' is held by job " \
        f"{live} (queued)" == one_line(done.stderr)
    assert "queued 1 job again, 1 left dead" in done.stdout
    assert (status(conn, keyed), status(conn, plain)) == ("dead", "queued")


def test_enqueue_says_in_one_line_what_is_wrong_with_a_tenant_or_a_payload(
        scratch: Scratch, home: Path) -> None:
    for args in (["--tenant", "acme"], ["--tenant", "1", "--payload", '{"a": "\\u0000"}']):
        done = cli(home, "enqueue", "noop", *args, "--dsn", scratch.worker)
        assert done.returncode == 2, (args, done.stderr)
        assert "cannot queue this job" in one_line(done.stderr), args


def test_a_listing_ends_quietly_when_its_reader_does(scratch: Scratch, home: Path,
                                                   conn: psycopg.Connection) -> None:
    """`jobqueue jobs | head -1`: more output than a pipe holds, the reader gone after a line."""
    enqueue_many(conn, [Job("noop", 1) for _ in range(3000)])
    for argv in (["jobs", "--limit", "3000"], ["stats"]):
        child = subprocess.Popen([*PROG, *argv, "--dsn", scratch.worker], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=home, env=env(home))
        assert child.stdout is not None and child.stderr is not None
        child.stdout.readline()
        child.stdout.close()  # as head -1 does
        err = child.stderr.read()
        child.stderr.close()
        assert child.wait(timeout=WAIT) == 0 and err == "", (argv, err)


def test_concurrent_enqueue_many_with_shared_unique_keys_never_deadlock(scratch: Scratch) -> None:
    """Six callers at once, each queueing the same 40 keys in its own order, in its own
    transaction, three rounds. Before: some calls ended in a deadlock."""
    callers, rounds, keys = 6, 3, 40
    barrier = threading.Barrier(callers)
    errors: list[BaseException] = []
    ids: dict[str, set[int]] = {}
    lock = threading.Lock()

    def caller(n: int) -> None:
        rng = random.Random(n)
        with scratch.connect("worker", f"test enqueue_many {n}") as c:
            for r in range(rounds):
                names = [f"r{r}-k{i}" for i in range(keys)]
                rng.shuffle(names)
                barrier.wait(timeout=WAIT)
                try:
                    with c.transaction():
                        got = enqueue_many(c, [Job("noop", 1, unique_key=k) for k in names])
                        time.sleep(0.05)  # hold the keys a moment, as an application would
                except Exception as e:  # noqa: BLE001  # the test counts them
                    errors.append(e)
                    continue
                with lock:
                    for k, i in zip(names, got, strict=True):
                        ids.setdefault(k, set()).add(i)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=2 * WAIT)
    assert not errors, f"{len(errors)} of {callers * rounds} calls failed: {errors[0]!r}"
    assert len(ids) == rounds * keys and all(len(v) == 1 for v in ids.values())
