"""Routing in jobqueue: queues, priorities, unique jobs, periodic jobs, and enqueueing many."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import HERE, Scratch
from psycopg import sql

from jobqueue import (
    ConfigError,
    Cron,
    Handlers,
    Job,
    Leased,
    Schedules,
    UnknownKind,
    Worker,
    WorkerOptions,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
)
from jobqueue.enqueue import BULK_ANALYZE
from jobqueue.ops import retry_dead
from jobqueue.periodic import Periodic
from jobqueue.queries import q

NOOP = Handlers({"noop": lambda conn, job: None, "other": lambda conn, job: None})
UTC_NOON = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)  # a Saturday


# -- offline: the cron parser and the declarations ---------------------------------------------

@pytest.mark.parametrize(("expr", "after", "next_", "last"), [
    ("*/15 9-17 * * mon-fri", UTC_NOON, "2026-12-07 09:00", "2026-12-04 17:45"),
    ("@daily", UTC_NOON, "2026-12-06 00:00", "2026-12-05 00:00"),
    ("0 0 13 * fri", UTC_NOON, "2026-12-11 00:00", "2026-12-04 00:00"),  # either day matches
    ("30 2 29 feb *", UTC_NOON, "2028-02-29 02:30", "2024-02-29 02:30"),
    ("0 12 * * 7", UTC_NOON, "2026-12-06 12:00", "2026-11-29 12:00"),  # 7 is Sunday too
    ("5,10-12/2 * * * *", UTC_NOON, "2026-12-05 12:05", "2026-12-05 11:12"),
])
def test_cron_finds_the_next_and_the_last_slot(expr: str, after: datetime, next_: str,
                                               last: str) -> None:
    cron = Cron.parse(expr)
    assert f"{cron.next_after(after):%Y-%m-%d %H:%M}" == next_
    assert f"{cron.last_at_or_before(after):%Y-%m-%d %H:%M}" == last


@pytest.mark.parametrize(("expr", "says"), [
    ("* * *", "5 fields"),
    ("60 * * * *", "minute 60 is out of range 0-59"),
    ("* 24 * * *", "hour 24 is out of range 0-23"),
    ("0 0 30 2 *", "never matches"),
    ("*/0 * * * *", "step '0' must be a whole number of at least 1"),
    ("5-1 * * * *", "runs backwards"),
    ("0 0 * foo *", "month 'foo' is not a number (1-12 or jan-dec)"),
    ("0 0 * * 1,", "empty item"),
])
def test_cron_refuses_what_it_cannot_read_and_says_what_is_valid(expr: str, says: str) -> None:
    with pytest.raises(ConfigError, match="cron") as e:
        Cron.parse(expr)
    assert says in str(e.value)


def test_a_schedule_is_an_interval_or_a_cron_and_a_valid_job() -> None:
    s = Schedules()
    s.add("sync", "noop", tenant=1, every=60)
    for kwargs, says in [({"every": 60}, "already declared"),
                         ({"every": 60, "cron": "* * * * *"}, "one of them"),
                         ({}, "one of them"), ({"every": 0}, "every must be from 1"),
                         ({"cron": "* * * *"}, "5 fields")]:
        with pytest.raises(ConfigError, match=says):
            s.add("sync" if says == "already declared" else "x", "noop", tenant=1, **kwargs)
    with pytest.raises(ConfigError, match="priority"):
        s.add("y", "noop", tenant=1, every=5, priority=10**6)
    assert [x.name for x in s] == ["sync"]


def test_enqueue_refuses_a_bad_queue_priority_or_kind_before_any_statement() -> None:
    class Unused:
        def execute(self, *a: Any) -> Any:
            raise AssertionError("no statement for a refused job")
    conn: Any = Unused()
    for kwargs, error, says in [
        ({"queue": ""}, ConfigError, "queue"), ({"queue": "a,b"}, ConfigError, "commas"),
        ({"priority": 11}, ConfigError, "priority"), ({"unique_key": ""}, ConfigError, "key"),
        ({"known": NOOP, "kind": "nope"}, UnknownKind, "known: noop, other"),
    ]:
        kind = kwargs.pop("kind", "noop")
        with pytest.raises(error, match=says):
            enqueue(conn, kind, tenant=1, **kwargs)
    with pytest.raises(UnknownKind, match="'nope'"):
        enqueue_many(conn, [{"kind": "noop", "tenant": 1}, {"kind": "nope", "tenant": 1}],
                     known=NOOP)
    with pytest.raises(ConfigError, match="queue"):
        WorkerOptions(queues=" ,")


# -- live ----------------------------------------------------------------------------------------

@pytest.fixture
def conn(scratch: Scratch):
    with scratch.connect("worker", "test routing", autocommit=True) as c:
        yield c


def _claim_all(leased: Leased, conn: psycopg.Connection) -> list[tuple[str, int, int]]:
    order = []
    while (c := leased.claim(conn)) is not None:
        row = conn.execute("select queue, priority from jobqueue.jobs where id = %s", [c.id]).fetchone()
        order.append((row[0], row[1], c.id))
    return order


def test_a_worker_claims_its_queues_only_highest_priority_first_then_oldest(conn) -> None:
    ids = {}
    for name, queue, priority in [("a0", "a", 0), ("a5", "a", 5), ("b9", "b", 9),
                                  ("a5b", "a", 5), ("a-1", "a", -1), ("c0", "c", 0),
                                  ("b0", "b", 0)]:
        ids[name] = enqueue(conn, "noop", tenant=1, queue=queue, priority=priority)
    # Scheduled for later: not claimable now, whatever its priority.
    enqueue(conn, "noop", tenant=1, queue="a", priority=10, run_after=3600)
    a_only = _claim_all(Leased(NOOP, queues=["a"], heartbeat=None), conn)
    assert [i for _, _, i in a_only] == [ids["a5"], ids["a5b"], ids["a0"], ids["a-1"]]
    # Two queues: one order across both (priority, then age); queue c is nobody's here.
    both = _claim_all(Leased(NOOP, queues="b,a", heartbeat=None), conn)
    assert [i for _, _, i in both] == [ids["b9"], ids["b0"]]
    assert conn.execute("select count(*) from jobqueue.jobs where queue = 'c' and status = 'queued'"
                        ).fetchone() == (1,)


def test_the_claim_names_queue_and_priority_and_stops_early(scratch: Scratch, conn) -> None:
    with scratch.connect("admin", "test routing fill", autocommit=True) as admin:
        # Another queue's backlog, and higher priorities not due yet, in front of one ready job.
        admin.execute("insert into jobqueue.jobs (tenant_id, kind, queue) "
                      "select 1 + g % 100, 'noop', 'bulk' from generate_series(1, 20000) g")
        admin.execute("insert into jobqueue.jobs (tenant_id, kind, priority, run_after) "
                      "select 1, 'noop', 1 + g % 5, now() + interval '1 day' "
                      "from generate_series(1, 20000) g")
        admin.execute("insert into jobqueue.jobs (tenant_id, kind) values (1, 'noop')")
        admin.execute("vacuum analyze jobqueue.jobs")
    if conn.info.server_version < 170000:
        pytest.skip("PostgreSQL 17 walks `priority = any(...)` in index order; 15 and 16 read more")
    params = {"lease": 30, "batch": 1, "kinds": ["noop"], "queues": ["default"]}
    with conn.transaction(force_rollback=True):
        (doc,), = conn.execute(b"explain (analyze, buffers, format json) "
                               + q("claim_leased").encode(), params).fetchall()
    plan = json.dumps(doc)
    assert "jobs_claimable" in plan and '"Actual Rows": 1' in plan and '"Sort"' not in plan
    choice = doc[0]["Plan"]["Plans"][0]  # the InitPlan: the choice of job, before the update
    assert choice["Node Type"] == "Limit", plan[:3000]
    buffers = choice["Shared Hit Blocks"] + choice.get("Shared Read Blocks", 0)
    # One descent and a few steps (9 here); walking the 40,000 jobs in front reads hundreds.
    assert buffers < 30, f"the claim's choice read {buffers} buffers:\n{plan[:3000]}"


def test_a_unique_key_returns_the_live_job_also_when_two_enqueue_it_at_once(
        scratch: Scratch, conn) -> None:
    first = enqueue(conn, "noop", tenant=1, unique_key="invoice-7")
    assert enqueue(conn, "noop", tenant=2, unique_key="invoice-7") == first
    # Two transactions at once: the second waits for the first's insert, then gets its id.
    with scratch.connect("worker", "test unique a") as a, \
            scratch.connect("worker", "test unique b") as b:
        mine = enqueue(a, "noop", tenant=1, unique_key="k2")
        got: dict[str, int] = {}
        other = threading.Thread(target=lambda: got.update(
            id=enqueue(b, "noop", tenant=1, unique_key="k2")))
        other.start()
        other.join(0.5)
        assert other.is_alive(), "the second enqueue did not wait for the first's transaction"
        a.commit()
        other.join(10)
        b.commit()
    assert got["id"] == mine
    assert conn.execute("select count(*) from jobqueue.jobs where unique_key = 'k2'").fetchone() == (1,)
    # Done, the key is free again.
    leased = Leased(NOOP, heartbeat=None)
    while (c := leased.claim(conn)) is not None:
        leased.run_claimed(conn, c)
    assert enqueue(conn, "noop", tenant=1, unique_key="invoice-7") != first


def test_enqueue_many_queues_every_job_in_one_statement_in_order(conn) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    jobs: list[Any] = [Job("noop", 1 + i % 100, {"i": i}, queue="q" if i % 2 else "default",
                           priority=i % 3, max_attempts=1 + i % 4) for i in range(1000)]
    jobs += [{"kind": "noop", "tenant": 5, "payload": {"i": "u"}, "unique_key": "once"},
             {"kind": "noop", "tenant": 6, "payload": {"i": "u2"}, "unique_key": "once"},
             {"kind": "noop", "tenant": 7, "run_after": later},
             {"kind": "noop", "tenant": 8, "run_after": 3600}]
    ids = enqueue_many(conn, jobs)
    assert len(ids) == 1004 and len(set(ids)) == 1003 and ids[1000] == ids[1001]
    rows = {r[0]: r[1:] for r in conn.execute(
        "select id, tenant_id, payload, queue, priority, max_attempts, run_after > now() + "
        "interval '50 minutes' from jobqueue.jobs").fetchall()}
    assert len(rows) == 1003
    for i, job in enumerate(jobs[:1000]):
        assert rows[ids[i]] == (job.tenant, {"i": i}, job.queue, job.priority,
                                job.max_attempts, False)
    assert rows[ids[1000]][1] == {"i": "u"}
    assert rows[ids[1002]][-1] and rows[ids[1003]][-1]
    assert enqueue_many(conn, [{"kind": "noop", "tenant": 1, "unique_key": "once"}]) == [ids[1000]]
    assert enqueue_many(conn, []) == []


def _kept_claim_buffers(conn: psycopg.Connection, leased: Leased) -> int:
    """Claim once through the worker's prepared claim, on the plan PostgreSQL keeps for it
    (EXPLAIN ANALYZE EXECUTE; committed: its job stays leased); return the buffers it read."""
    query, params = leased.claim_query(1)
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", query)))
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", query)
    row = conn.execute("select name from pg_prepared_statements where statement = %s", (text,),
                       prepare=False).fetchone()
    assert row is not None, "the worker's claim is not prepared"
    args = ", ".join(f"%({n})s" for n in names)
    (doc,), = psycopg.ClientCursor(conn).execute(
        f"explain (analyze, buffers, format json) execute {row[0]}({args})", params).fetchall()
    plan = (doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"]
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


@pytest.mark.parametrize("bulk", ["enqueue_many", "retry_dead"])
def test_a_bulk_operation_remakes_the_plans_a_running_worker_kept(scratch: Scratch,
                                                                  bulk: str) -> None:
    """Issue 32, item 4: a worker running while the queue held a few jobs keeps a generic plan
    for its prepared claim, made with that size: a seq scan of every job. After a bulk of 5,000
    its claim read 173 buffers (3,097 after 100,000: about 40 ms a claim) until autoanalyze.
    The bulk operation analyzes the table: the kept plans are made again, tens of buffers.
    (After retry --dead the plans were made with the dead jobs in the table: index scans
    already, 21 buffers before the fix too; kept as a guard.)"""
    leased = Leased(NOOP, heartbeat=None)
    with scratch.connect("admin", "test bulk", autocommit=True) as admin, \
            scratch.connect("worker", "test bulk worker", autocommit=True) as conn, \
            scratch.connect("worker", "test bulk app", autocommit=True) as app:
        if bulk == "retry_dead":
            admin.execute("insert into jobqueue.jobs (tenant_id, kind, status, attempts, "
                          "max_attempts, finished) select g % 100, 'noop', 'dead', 3, 3, now() "
                          "from generate_series(1, 5000) g")
        admin.execute("analyze jobqueue.jobs")  # the statistics from before the bulk
        enqueue_many(app, [{"kind": "noop", "tenant": 1}] * 20)
        for _ in range(20):  # prepared at the 5th, its generic plan kept from the 11th on
            claim = leased.claim(conn)
            assert claim is not None
            leased.run_claimed(conn, claim)
        assert leased.claim(conn) is None
        if bulk == "enqueue_many":
            enqueue_many(app, [{"kind": "noop", "tenant": 1 + i % 100} for i in range(5000)])
        else:
            assert len(retry_dead(app)) == 5000
        assert _kept_claim_buffers(conn, leased) < 50


def test_after_a_bulk_the_claim_goes_back_to_its_kept_plan(scratch: Scratch) -> None:
    """Once the queue is large and analyzed, PostgreSQL costs a generic plan's `limit $n` at a
    tenth of the rows: the claim was planned afresh at every claim (40 plans in 40 claims
    after 5,000 queued). With the batch size written in, it keeps a generic plan again."""
    leased = Leased(NOOP, heartbeat=None)
    with scratch.connect("worker", "test bulk worker", autocommit=True) as conn, \
            scratch.connect("worker", "test bulk app", autocommit=True) as app:
        def plans() -> tuple[int, int]:
            row = conn.execute("select generic_plans, custom_plans from pg_prepared_statements"
                               " where statement like 'update jobqueue.jobs%%claimable%%'"
                               ).fetchone()
            assert row is not None, "the worker's claim is not prepared"
            return int(row[0]), int(row[1])
        enqueue_many(app, [{"kind": "noop", "tenant": 1}] * 20)
        for _ in range(20):
            claim = leased.claim(conn)
            assert claim is not None
            leased.run_claimed(conn, claim)
        enqueue_many(app, [{"kind": "noop", "tenant": 1 + i % 100} for i in range(5000)])
        generic, custom = plans()
        for _ in range(40):
            claim = leased.claim(conn)
            assert claim is not None
            leased.run_claimed(conn, claim)
        assert plans()[0] > generic, (plans(), generic, custom)


def test_a_bulk_analyze_never_waits_and_skips_small_bulks(scratch: Scratch) -> None:
    """analyze_after_bulk does nothing below BULK_ANALYZE jobs, nor while another session holds
    the table's analyze lock (autovacuum, another bulk): it never makes an enqueue wait."""
    with scratch.connect("admin", "test bulk", autocommit=True) as admin, \
            scratch.connect("worker", "test bulk app", autocommit=True) as app:
        def reltuples() -> float:
            row = admin.execute("select reltuples from pg_class "
                                "where oid = 'jobqueue.jobs'::regclass").fetchone()
            assert row is not None
            return float(row[0])
        before = reltuples()
        enqueue_many(app, [{"kind": "noop", "tenant": 1}] * (BULK_ANALYZE - 1))
        assert reltuples() == before
        with admin.transaction():
            admin.execute("lock table jobqueue.jobs in share update exclusive mode")
            app.execute("set lock_timeout = '5s'")
            enqueue_many(app, [{"kind": "noop", "tenant": 1}] * BULK_ANALYZE)
        assert reltuples() == before
        enqueue_many(app, [{"kind": "noop", "tenant": 1}] * BULK_ANALYZE)
        assert reltuples() == 3 * BULK_ANALYZE - 1


def test_a_bulk_on_a_schema_before_0006_queues_its_jobs(scratch: Scratch) -> None:
    """An application upgraded before `migrate`: no analyze_after_bulk; the bulk still queues
    every job, in the caller's transaction too (the call fails in a savepoint of its own)."""
    with scratch.connect("owner", "test bulk owner", autocommit=True) as owner:
        owner.execute("drop function jobqueue.analyze_after_bulk(bigint)")
    with scratch.connect("worker", "test bulk app") as app:
        ids = enqueue_many(app, [{"kind": "noop", "tenant": 1}] * BULK_ANALYZE)
        app.commit()
        assert app.execute("select count(*) from jobqueue.jobs").fetchone() == (len(ids),)


def test_a_role_without_the_grant_queues_its_bulk_and_cannot_analyze(scratch: Scratch) -> None:
    """analyze_after_bulk is not PUBLIC: a role not granted it (an untrusted one) cannot make it
    analyze (and hold the table's lock) at will; a bulk by such a role still queues every job."""
    with scratch.connect("owner", "test bulk owner", autocommit=True) as owner:
        owner.execute(sql.SQL("revoke execute on function jobqueue.analyze_after_bulk(bigint) "
                              "from {}").format(sql.Identifier(scratch.worker_role)))
    with scratch.connect("worker", "test bulk app") as app:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("select jobqueue.analyze_after_bulk(1000000)")
        app.rollback()
        ids = enqueue_many(app, [{"kind": "noop", "tenant": 1}] * BULK_ANALYZE)
        app.commit()
        assert app.execute("select count(*) from jobqueue.jobs").fetchone() == (len(ids),)


def test_async_enqueue_on_an_async_connection(scratch: Scratch) -> None:
    async def main() -> tuple[int, list[int], int]:
        async with await psycopg.AsyncConnection.connect(scratch.worker, autocommit=True) as a:
            one = await enqueue_async(a, "noop", tenant=3, payload={"x": 1}, priority=2)
            many = await enqueue_many_async(a, [Job("noop", 4), Job("noop", 4, unique_key="u"),
                                                Job("noop", 4, unique_key="u")])
            again = await enqueue_async(a, "noop", tenant=4, unique_key="u")
            with pytest.raises(ConfigError, match="await enqueue_async"):
                enqueue(a, "noop", tenant=4)  # type: ignore[arg-type]
            return one, many, again
    one, many, again = asyncio.run(main())
    assert many[1] == many[2] == again and len({one, *many}) == 3
    with scratch.connect("worker", "test async check", autocommit=True) as c:
        assert c.execute("select tenant_id, priority, payload from jobqueue.jobs where id = %s",
                         [one]).fetchone() == (3, 2, {"x": 1})


def test_a_periodic_slot_is_enqueued_once_however_many_workers_tick(scratch: Scratch) -> None:
    s = Schedules()
    s.add("tick", "noop", tenant=1, every=10, queue="maintenance", priority=3)
    now = [1_000_000.0]
    with scratch.connect("worker", "test periodic a", autocommit=True) as a, \
            scratch.connect("worker", "test periodic b", autocommit=True) as b:
        # The slots follow the server's clock (faked here, with the host's clock the same).
        wa = Periodic(s, clock=lambda: now[0], server_clock=lambda c: now[0])
        wb = Periodic(s, clock=lambda: now[0] - 0.5, server_clock=lambda c: now[0] - 0.5)
        # First sight: the slot is recorded, nothing enqueued (a new schedule starts next slot).
        assert wa.tick(a) == [] and wb.tick(b) == []
        enqueued = []
        for _ in range(4):  # four slots, both workers ticking several times in each
            now[0] += 10
            for _ in range(3):
                enqueued += wa.tick(a) + wb.tick(b)
                now[0] += 0.1
        # A late worker (its clock a slot behind) finds its slot taken, even once it ran.
        Leased(NOOP, heartbeat=None).run_one(a)
        late = Periodic(s, clock=lambda: now[0] - 10, server_clock=lambda c: now[0] - 10)
        assert late.tick(b) == []
        rows = a.execute("select unique_key, queue, priority from jobqueue.jobs order by id").fetchall()
    assert len(enqueued) == 4 == len(rows) == len({r[0] for r in rows})
    assert all(r[0].startswith("periodic:tick@") and r[1:] == ("maintenance", 3) for r in rows)


def test_a_worker_enqueues_its_periodic_jobs_and_runs_them(scratch: Scratch) -> None:
    s = Schedules()
    s.add("minutely", "noop", tenant=1, cron="* * * * *")
    with scratch.connect("worker", "test periodic w", autocommit=True) as c:
        c.execute(q("periodic_enqueue"), s._by_name["minutely"].params(  # seen before
            datetime(2000, 1, 1, tzinfo=UTC)))
    options = WorkerOptions(until_empty=True, listen=False, heartbeat=0.0)
    assert Worker(scratch.worker, options, NOOP, schedules=s).run() == 1


def test_the_enqueue_command_prints_the_id(scratch: Scratch) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "jobqueue", "enqueue", *args,
                               "--dsn", scratch.worker], capture_output=True, text=True,
                              timeout=60, env=dict(os.environ, PYTHONPATH=str(HERE)))
    out = run("noop", "--tenant", "7", "--payload", '{"a": 1}', "--queue", "mail",
              "--priority", "4", "--unique-key", "k", "--run-after", "60", "--json")
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)["id"]
    assert run("noop", "--tenant", "7", "--unique-key", "k").stdout.strip() == str(job)
    bad = run("nope", "--tenant", "7", "--handlers", "noop_handlers")
    assert bad.returncode == 2 and "unknown job kind 'nope'; known: " in bad.stderr
    with scratch.connect("worker", "test enqueue cmd", autocommit=True) as c:
        assert c.execute("select tenant_id, payload, queue, priority, run_after > now() "
                         "from jobqueue.jobs").fetchall() == [(7, {"a": 1}, "mail", 4, True)]
