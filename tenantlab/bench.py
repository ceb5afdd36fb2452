"""What the queue costs per job: no-op jobs through each design, on the user's own server.

``tenantlab bench`` (or ``make bench``), in scratch databases, one round after another. The
production rows (the worker loop, routing, enqueue rates, worker processes, the claim's cost,
idle latency) run on the product's own schema, as ``jobqueue migrate`` makes it
(``db.install_product``); the lab's designs (``single``, ``leased_run_one``,
``leased_lossy_claim``) on the lab's:
``select1`` (the round-trip floor), ``commit1`` (the floor of a durable commit: a round trip and
a WAL flush), ``single`` (the naive single transaction, its error
handler on), ``leased`` (the production worker loop on one connection, its defaults: durable
claim, the next claim riding on the finish's commit, the heartbeat on), ``leased_heartbeat``
(the same, heartbeat every 10 s), ``leased_no_heartbeat`` (``--heartbeat 0``),
``leased_batch`` (``--batch 10``), ``leased_batch_commit`` (``--batch 10 --batch-commit``:
one commit per batch), ``leased_run_one`` (claim, execute, finish: two commits per job) and
``leased_lossy_claim`` (its claim not flushed); the routing rows (``leased_priority``,
``leased_queues``, ``leased_unique``: see ``ROUTING``) and the enqueue rates (``enqueue_one``,
``enqueue_many``); then worker processes side by side
(``workers_N``), the claim's cost on top of a history of finished jobs, behind jobs not yet
due (scheduled for tomorrow, in backoff) and behind exhausted ones the reaper has not reached
yet, the idle latency from enqueue to start (LISTEN/NOTIFY, and poll only), and with ``--peers``
procrastinate, PgQueuer (asyncpg; psycopg as ``pgqueuer_psycopg``) and awa (10 permits, its
default; ``awa_one``: one) when installed (the dev and bench extras). Each row's WAL flushes per
job are counted too (``pg_stat_wal``, every session of the server: the bench's own). Not a test:
timings depend on the machine; read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import psycopg
from jobqueue import Handlers, Leased, Worker, WorkerOptions, enqueue, enqueue_many
from jobqueue.ops import retry_dead
from jobqueue.options import Parser, count, number
from psycopg import sql

from . import bench_ceiling, bench_profile, db, kinds, queue
from .bench_peers import Clock
from .queries import q
from .validate import output_file

#: In process, on one connection: the naive design and the corrected one's run_one loop.
DESIGNS: dict[str, Callable[[], Any]] = {
    "single": lambda: queue.SingleTransaction(handle_errors=True),
    "leased_run_one": lambda: queue.Leased(lease=30.0, backoff=1.0),
    "leased_lossy_claim": lambda: queue.Leased(lease=30.0, backoff=1.0, durable_claim=False),
}
#: In process, the production worker loop (``jobqueue.Worker``) on one connection: the claim
#: of the next job rides on the finish's commit.
LOOPS: dict[str, WorkerOptions] = {
    "leased": WorkerOptions(until_empty=True, listen=False),
    "leased_heartbeat": WorkerOptions(until_empty=True, listen=False, heartbeat=10.0),
    "leased_no_heartbeat": WorkerOptions(until_empty=True, listen=False, heartbeat=0.0),
    "leased_batch": WorkerOptions(until_empty=True, listen=False, batch=10),
    "leased_batch_commit": WorkerOptions(until_empty=True, listen=False, batch=10,
                                         batch_commit=True),
    # Fair claims (issue 32, item 3): the same loop over the same jobs, --fair round-robin and
    # --fair limit=1 (one worker: the limit skips the tenant of the job it just finished).
    "leased_round_robin": WorkerOptions(until_empty=True, listen=False, fair="round-robin"),
    "leased_limit": WorkerOptions(until_empty=True, listen=False, fair="limit=1"),
}
#: The loops' jobs are spread over this many tenants (``--tenants``); at least one job each.
TENANTS = 100
BATCH = 10
LATENCY_JOBS = 60
#: The ceiling's rows (bench_ceiling): jobs per transaction of each.
CEILINGS = {"one": 1, "batch": BATCH}

#: What each of the kit's rows makes durable per WAL flush (read from its code; the bench counts
#: the flushes, ``wal_flushes_per_job``).
DURABILITY = {
    "select1": "no write",
    "commit1": "one flush per commit: the floor under a flush per job",
    "ceiling_one": "flush per job: the finish and the next claim in one commit (pgbench)",
    "ceiling_batch": "flush per batch: 10 finishes and the next claim in one commit (pgbench)",
    "single": "flush per job: claim, work and finish in one commit",
    "leased_run_one": "two flushes per job: the claim commits on its own, then the finish",
    "leased_lossy_claim": "flush per job: the finish; the claim commits without waiting for "
                          "its flush",
    "leased": "flush per job: the finish and the next claim in one commit",
    "leased_heartbeat": "flush per job, as `leased`",
    "leased_no_heartbeat": "flush per job, as `leased`",
    "leased_batch": "flush per job: each finish commits; the next 10 claimed with the last",
    "leased_batch_commit": "flush per batch: 10 finishes and the next claim in one commit",
    "leased_round_robin": "flush per job, as `leased`",
    "leased_limit": "flush per job, as `leased`",
    "workers": "flush per job, as `leased`",
}


@contextmanager
def product_db() -> Iterator[db.Scratch]:
    """A scratch database holding the product's own schema (``jobqueue migrate``), not the lab's."""
    with db.scratch("bench_product") as p:
        db.install_product(p.admin)
        yield p


def _reset(s: db.Scratch) -> None:
    with s.connect("admin", "bench reset", autocommit=True) as admin:
        admin.execute(q("reset_queue"))


def select1(s: db.Scratch, n: int) -> float:
    """Return round trips per second of a `select 1` loop on one connection."""
    with s.connect("worker", "bench select1", autocommit=True) as conn:
        query = q("bench_select1")
        started = time.perf_counter()
        for _ in range(n):
            conn.execute(query).fetchone()
        return n / (time.perf_counter() - started)


def commit1(s: db.Scratch, n: int) -> float:
    """Return durable commits per second of a loop of the smallest write transaction."""
    with s.connect("worker", "bench commit1", autocommit=True) as conn:
        query = q("bench_commit1")
        started = time.perf_counter()
        for _ in range(n):
            conn.execute(query)
        return n / (time.perf_counter() - started)


def wal_flushes(s: db.Scratch) -> float | None:
    """Return the server's WAL flushes so far (all sessions), or None where it does not say."""
    with s.connect("admin", "bench wal", autocommit=True) as c:
        for name in ("bench_wal_flushes", "bench_wal_flushes_io"):
            try:
                return float(db.scalar(c, q(name)))
            except psycopg.Error:
                continue
    return None


#: A session's statistics reach the shared counters when it ends: time for the sessions of a
#: drain (its worker, heartbeat, peer pool) to end before the flushes are read.
STATS_SETTLE = bench_profile.SETTLE
#: The profiler of the row being measured (``run``): a drain marks where its timed part starts
#: and stops, so its set-up (queueing the jobs) is not counted in the row's server profile.
_profiler: bench_profile.Profiler | None = None


def _mark(where: str) -> None:
    if _profiler is not None:
        _profiler.mark() if where == "start" else _profiler.stop()


def _stop() -> None:
    _mark("stop")


def drain(s: db.Scratch, name: str, jobs: int, tenants: int = TENANTS) -> dict[str, float]:
    """Queue `jobs` no-op jobs, run them all with one design; return rates (and the drift).

    The worker loops' jobs are spread over `tenants` tenants (as many jobs as tenants at least:
    each has work); the lab's designs', over the lab's 100.
    """
    _reset(s)
    with s.connect("worker", "bench enqueue", autocommit=True) as conn:
        if name in LOOPS:
            jobs = max(jobs, tenants)
            enqueue_many(conn, [{"kind": "noop", "tenant": 1 + i % tenants,
                                 "payload": {"seconds": 0.0}} for i in range(jobs)])
        else:
            queue.enqueue(conn, "noop", count=jobs)
    _mark("start")
    started = time.perf_counter()
    clock = Clock(jobs)
    if name in LOOPS:
        done = Worker(s.worker, replace(LOOPS[name], name=f"bench-{name}"), clocked(clock)).run()
    else:
        done = 0
        d = DESIGNS[name]()
        with s.connect("worker", f"bench {name}", autocommit=True) as conn:
            while d.run_one(conn) is not None:
                done += 1
                clock.tick()  # a design's job ends with its run_one: first job's end to last
    elapsed = time.perf_counter() - started
    _mark("stop")
    if done != jobs:
        raise RuntimeError(f"bench {name}: ran {done} of {jobs} jobs")
    with s.connect("worker", "bench times", autocommit=True) as conn:
        t = [r[0] for r in conn.execute(q("bench_finish_times")).fetchall()]
    tenth = max(2, len(t) // 10)
    drift = (t[tenth - 1] - t[0]) / max(t[-1] - t[-tenth], 1e-9)
    # jobs_per_s_whole: the same drain from the worker's start to its end (start-up included)
    return {**clock.rate(), "drift": drift, "jobs_per_s_whole": jobs / elapsed}


def clocked(clock: Clock) -> Handlers:
    """The no-op kind, ticking `clock` at each execution: a worker's rate from its first job's
    execution to its last, start-up and shut-down left out, as the peers' (``Clock``)."""
    handlers = Handlers()

    @handlers.register("noop")
    def noop(conn: psycopg.Connection, job: Any) -> None:
        clock.tick()

    return handlers


def cpu_seconds() -> float:
    """Return the CPU time of this process (all its threads) and of its ended children."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


#: Routing (issue 23): the ``leased`` loop on jobs that use what routing adds, each against
#: ``leased`` in the same round (``ratios``: ``<row>_vs_leased``, 1.0 = costs nothing): four
#: priorities; two queues served by one worker; a unique key on every job. The jobs are queued
#: by ``jobqueue.enqueue_many``, whose rate (one statement, ``enqueue_many``) is measured next
#: to one ``enqueue`` per job in one transaction (``enqueue_one``). ``leased_plain`` is their
#: control: the same loop on jobs queued the same way, without queues, priorities or keys
#: (``<row>_vs_plain``: what routing itself costs, the enqueue path and the table's state alike).
ROUTING: dict[str, tuple[WorkerOptions, Callable[[int], dict[str, Any]]]] = {
    "leased_plain": (LOOPS["leased"], lambda i: {}),
    "leased_priority": (LOOPS["leased"], lambda i: {"priority": i % 4}),
    "leased_queues": (replace(LOOPS["leased"], queues="default,other"),
                      lambda i: {"queue": "other" if i % 2 else "default"}),
    "leased_unique": (LOOPS["leased"], lambda i: {"unique_key": f"bench-{i}"}),
}
ENQUEUE_MANY = 20_000


def drain_routing(s: db.Scratch, name: str, jobs: int) -> dict[str, float]:
    """Queue `jobs` no-op jobs shaped by the routing row `name`, run them all; return rates."""
    options, shape = ROUTING[name]
    _reset(s)
    with s.connect("worker", "bench enqueue", autocommit=True) as conn:
        enqueue_many(conn, [dict(kind="noop", tenant=1 + i % 100, payload={"seconds": 0.0},
                                 **shape(i)) for i in range(jobs)])
    _mark("start")
    started = time.perf_counter()
    clock = Clock(jobs)
    done = Worker(s.worker, replace(options, name=f"bench-{name}"), clocked(clock)).run()
    elapsed = time.perf_counter() - started
    _mark("stop")
    if done != jobs:
        raise RuntimeError(f"bench {name}: ran {done} of {jobs} jobs")
    return {**clock.rate(), "jobs_per_s_whole": jobs / elapsed}


def enqueue_rates(s: db.Scratch, jobs: int) -> dict[str, float]:
    """Return jobs/s queued by ``enqueue_many`` (one statement) and by one ``enqueue`` per job."""
    _reset(s)
    many = max(jobs, ENQUEUE_MANY)
    with s.connect("worker", "bench enqueue many", autocommit=True) as conn:
        batch = [{"kind": "noop", "tenant": 1 + i % 100, "payload": {"i": i}} for i in range(many)]
        started = time.perf_counter()
        enqueue_many(conn, batch)
        rate_many = many / (time.perf_counter() - started)
        started = time.perf_counter()
        with conn.transaction():
            for i in range(jobs):
                enqueue(conn, "noop", tenant=1 + i % 100, payload={"i": i})
        rate_one = jobs / (time.perf_counter() - started)
    return {"enqueue_many": rate_many, "enqueue_one": rate_one}


def _routing_ratios(jps: dict[str, float]) -> dict[str, float]:
    out = {f"{name}_vs_leased": jps[name] / jps["leased"] for name in ROUTING if name in jps}
    if "leased_plain" in jps:
        out |= {f"{name}_vs_plain": jps[name] / jps["leased_plain"]
                for name in ROUTING if name in jps and name != "leased_plain"}
    if "enqueue_many" in jps and "enqueue_one" in jps:
        out["enqueue_many_vs_one"] = jps["enqueue_many"] / jps["enqueue_one"]
    return {k: round(v, 3) for k, v in out.items()}


#: What may sit in front of the ready jobs (lower ids) without being claimable: the fill query
#: of each.
NOT_DUE = {"scheduled": "bench_fill_scheduled", "backoff": "bench_fill_backoff",
           "exhausted": "bench_fill_exhausted"}


def claim_cost(s: db.Scratch, history: int, samples: int = 500, **not_due: int) -> dict[str, float]:
    """Return the claim's median ms with `history` finished jobs, on a queue and on none.

    ``not_due``: so many jobs of each kind of `NOT_DUE` (scheduled for tomorrow, in backoff,
    exhausted and unreaped) put in front of the ready ones: a claim must step over none of them.
    """
    _reset(s)
    with s.connect("admin", "bench history", autocommit=True) as admin:
        if history:
            admin.execute(q("bench_fill_history"), {"n": history})
        for what, n in not_due.items():
            if n:
                admin.execute(q(NOT_DUE[what]), {"n": n})
        admin.execute(q("horizon_vacuum_analyze_jobs"))
    # The claim alone, of the kinds the bench runs: no heartbeat thread sharing the machine.
    leased = Leased(kinds.handlers, lease=30.0, heartbeat=None)
    empty: list[float] = []
    with s.connect("worker", "bench claim", autocommit=True) as conn:
        queue.enqueue(conn, "noop", count=samples)
        busy = _timed_claims(conn, leased, samples)
        for _ in range(samples):
            t = time.perf_counter()
            assert leased.claim(conn) is None
            empty.append(time.perf_counter() - t)
    return {"claim_ms": round(statistics.median(busy) * 1000, 3),
            "claim_ms_empty_queue": round(statistics.median(empty) * 1000, 3)}


#: Jobs of the bulk operations before claim_after_bulk's first claims (issue 32, item 4).
BULK = 100_000


#: What the worker ran before the bulk operation: jobs claimed and run, then empty claims (idle
#: polls). psycopg prepares a statement at its 5th execution and PostgreSQL keeps a generic plan
#: for it after 5 more: the worker the bulk meets runs its claim on a plan made before.
WARM_CLAIMS = 20
WARM_POLLS = 5
#: A parameter of a query as psycopg writes it (``%(name)s``); psycopg numbers them in order of
#: first appearance ($1, $2 ...) in the statement it prepares.
_PARAM = re.compile(r"%\((\w+)\)s")


def _warm(conn: psycopg.Connection, app: psycopg.Connection, leased: Leased) -> None:
    """Run the worker on `conn` as it runs before a bulk operation: jobs, then idle polls."""
    queue.enqueue(app, "noop", count=WARM_CLAIMS)
    _timed_claims(conn, leased, WARM_CLAIMS)
    for _ in range(WARM_POLLS):
        assert leased.claim(conn) is None


def _explained_claim(conn: psycopg.Connection, leased: Leased) -> int:
    """Claim once through the worker's own prepared claim (EXPLAIN ANALYZE EXECUTE: the plan
    PostgreSQL keeps for it, not a fresh one); return the buffers it read.

    Committed, as a claim is: its job stays leased (the next claims skip it).
    """
    query, params = leased.claim_query(1)
    names = list(dict.fromkeys(_PARAM.findall(query)))
    text = _PARAM.sub(lambda m: f"${names.index(m.group(1)) + 1}", query).replace("%%", "%")
    row = conn.execute(q("bench_prepared_name"), {"statement": text}, prepare=False).fetchone()
    if row is None:
        raise RuntimeError("bench claim after bulk: the worker's claim is not prepared")
    explain = sql.SQL(q("bench_explain_prepared")).format(
        name=sql.Identifier(row[0]), args=sql.SQL(", ").join(map(sql.Placeholder, names)))
    # Literal parameters: EXECUTE takes expressions, cast to the statement's own types.
    (doc,) = psycopg.ClientCursor(conn).execute(explain, params).fetchone() or (None,)
    plan = (doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"]
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


def _first_claims(conn: psycopg.Connection, leased: Leased, samples: int) -> tuple[float, int]:
    """Return the median ms of the `samples` claims after the first, and the first's buffers."""
    buffers = _explained_claim(conn, leased)
    ms = _timed_claims(conn, leased, samples)
    return round(statistics.median(ms) * 1000, 3), buffers


def _timed_claims(conn: psycopg.Connection, leased: Leased, samples: int) -> list[float]:
    """Claim and run (doing nothing) `samples` jobs; return each claim's seconds."""
    seconds = []
    for _ in range(samples):
        t = time.perf_counter()
        claim = leased.claim(conn)
        seconds.append(time.perf_counter() - t)
        assert claim is not None
        leased.run_claimed(conn, claim, lambda c, j: None)
    return seconds


def claim_after_bulk(p: db.Scratch, jobs: int = BULK, samples: int = 20) -> dict[str, Any]:
    """Return a running worker's first claims' median ms (and buffers) after a bulk operation.

    The worker was running before it (``WARM_CLAIMS`` jobs, ``WARM_POLLS`` idle polls: its
    claim prepared, its plan kept); the application queues `jobs` jobs with ``enqueue_many`` on
    its own connection, or an operator runs ``retry --dead`` of `jobs`. The statistics are those
    of the table before (empty; only dead jobs): what autoanalyze leaves for about a minute. The
    first claim is explained (the plan the worker keeps, its buffers); the `samples` after it
    are timed: what a production worker meets, not a fresh connection's planning.
    """
    out: dict[str, Any] = {"jobs": jobs}
    leased = Leased(kinds.handlers, lease=30.0, heartbeat=None)
    _reset(p)
    with p.connect("admin", "bench bulk", autocommit=True) as admin:
        admin.execute(q("bench_analyze_jobs"))
    with p.connect("worker", "bench bulk", autocommit=True) as conn, \
            p.connect("worker", "bench enqueue many", autocommit=True) as app:
        _warm(conn, app, leased)
        enqueue_many(app, [{"kind": "noop", "tenant": 1 + i % 100, "payload": {}}
                           for i in range(jobs)])
        ms, buffers = _first_claims(conn, leased, samples)
    out |= {"claim_after_bulk_ms": ms, "claim_after_bulk_buffers": buffers}
    _reset(p)
    with p.connect("admin", "bench bulk", autocommit=True) as admin:
        admin.execute(q("bench_fill_dead"), {"n": jobs})
        admin.execute(q("horizon_vacuum_analyze_jobs"))
    with p.connect("worker", "bench bulk", autocommit=True) as conn, \
            p.connect("worker", "bench retry dead", autocommit=True) as ops:
        _warm(conn, ops, leased)
        retry_dead(ops)
        ms, buffers = _first_claims(conn, leased, samples)
    return out | {"claim_after_retry_dead_ms": ms, "claim_after_retry_dead_buffers": buffers}


def _worker_argv(*extra: str) -> list[str]:
    # The production entry point with the demo kinds: no notebook machinery to import.
    return [sys.executable, "-m", "jobqueue", "--handlers", "tenantlab.kinds", *extra]


def _env(s: db.Scratch) -> dict[str, str]:
    return dict(os.environ, JOBQUEUE_DSN=s.worker)


def idle_latency(s: db.Scratch, listen: bool, jobs: int = LATENCY_JOBS) -> dict[str, float]:
    """Start one idle worker; queue `jobs` jobs one at a time; return enqueue-to-start ms."""
    _reset(s)
    extra = ["--poll", "0.5"] + ([] if listen else ["--no-listen"])
    proc = subprocess.Popen(_worker_argv(*extra), env=_env(s), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)  # started, connected, listening, idle
        with s.connect("worker", "bench enqueue", autocommit=True) as conn:
            for _ in range(jobs):
                (job,) = queue.enqueue(conn, "noop", tenant=1)
                deadline = time.monotonic() + 10
                while conn.execute(q("job_states")).fetchall()[-1][3] != "done":
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"bench idle latency: job {job} never ran")
                    time.sleep(0.005)
                time.sleep(0.05)  # idle again, as a real lull would be
            ms = [r[0] for r in conn.execute(q("bench_latency_ms")).fetchall()]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    ms = sorted(float(x) for x in ms)
    return {"median": round(statistics.median(ms), 2),
            "p95": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 2)}


#: Idle workers for wake_transactions, and the jobs queued one at a time while they wait.
WAKE_WORKERS = 10
WAKE_JOBS = 20
#: A worker's line at its stop (-v): its claims of their own (not those riding on a finish).
WAKE_STOPPED = re.compile(r"stopped: \d+ jobs claimed; (\d+) claims of their own")


def wake_transactions(s: db.Scratch, workers: int = WAKE_WORKERS,
                      jobs: int = WAKE_JOBS) -> dict[str, float | None]:
    """Return the server transactions per job queued one at a time with `workers` idle ones.

    Counted from ``pg_stat_database`` (every session of the scratch database), minus those of
    an equal quiet period with the same workers (their presence and polls) and the enqueues'
    own: what waking them costs per job. Also the workers' claims of their own per job (1: one
    wake-up per job).
    """
    _reset(s)
    procs = [subprocess.Popen(_worker_argv("-v", "--poll", "30", "--name", f"bench-wake-{i}"),
                              env=_env(s), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for i in range(workers)]

    def counted(admin: psycopg.Connection) -> float:
        time.sleep(1.2)  # sessions report their counts at most once a second
        with admin.transaction():  # a snapshot of the statistics of its own
            return float(db.scalar(admin, q("bench_db_transactions"), {"name": s.name}))

    own = 0  # this function's transactions in the scratch database: enqueues and polls
    try:
        time.sleep(3.0)  # started, connected, listening, idle
        with db.connect(db.admin_dsn(), "bench wake") as admin, \
                s.connect("worker", "bench enqueue", autocommit=True) as conn:
            admin.autocommit = True
            start = time.monotonic()
            quiet0 = counted(admin)
            time.sleep(2.0)
            quiet = counted(admin) - quiet0
            quiet_s = time.monotonic() - start
            start, before = time.monotonic(), counted(admin)
            for _ in range(jobs):
                (job,) = queue.enqueue(conn, "noop", tenant=1)
                own += 1
                deadline = time.monotonic() + 10
                while True:
                    own += 1
                    if conn.execute(q("job_states")).fetchall()[-1][3] == "done":
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"bench wake: job {job} never ran")
                    time.sleep(0.01)
                time.sleep(0.1)  # idle again
            after = counted(admin)
            busy_s = time.monotonic() - start
    finally:
        for p in procs:
            p.terminate()
        logs = [p.communicate(timeout=30)[1] for p in procs]
    # The workers' own, less what they do when nothing is queued (the quiet rate, same time).
    woken = after - before - own - quiet * busy_s / quiet_s
    # Their claims of their own (each logs them at its stop), less each one's first at its start
    # (the --poll of 30 s makes no other before the jobs): every idle worker that woke and
    # claimed counts one. The transactions above also count, in every listening session, one
    # per NOTIFY (PostgreSQL reads its notification queue in a transaction of its own).
    rounds = [m for text in logs if (m := WAKE_STOPPED.search(text or ""))]
    claims = ((sum(int(m[1]) for m in rounds) - workers) / jobs
              if len(rounds) == workers else None)
    return {"workers": workers, "jobs": jobs, "quiet_per_s": round(quiet / quiet_s, 2),
            "transactions_per_job": round(woken / jobs, 2),
            "claims_per_job": None if claims is None else round(claims, 2)}


#: The noisy neighbour (issue 32, item 3), at the workshop's size: the finding's burst of one
#: tenant and 99 small tenants' jobs, drained by its worker processes (``python -m jobqueue``)
#: once per claim policy: each row's jobs/s is the first arrival's (the small tenants' jobs
#: arriving during the drain), as ``reproduce noisy-neighbour`` reports it; the row's profile
#: counts both arrivals (and their set-up: the enqueue, the workers' start) alike per policy.
NOISY: dict[str, str] = {"noisy_fifo": "fifo", "noisy_round_robin": "round-robin",
                         "noisy_limit": "limit"}
#: The noisy-neighbour rows' burst: the workshop's (``reproduce noisy-neighbour``'s).
NOISY_BURST = 1000


def noisy(s: db.Scratch, name: str, burst: int, out: dict[str, Any]) -> float:
    """Drain the noisy neighbour with one policy's worker processes; return its jobs/s arriving
    during the drain, and keep every arrival's measures in `out` (by row name)."""
    from .experiments import noisy_neighbour

    k = noisy_neighbour.Knobs.of(burst=burst)
    profiler = _profiler
    before = profiler.statements_of(s.name) if profiler else None
    got: dict[str, Any] = noisy_neighbour.drain(s, NOISY[name], k)
    if before is not None and profiler and (after := profiler.statements_of(s.name)) is not None:
        claim = CLAIMS[NOISY[name]]
        calls, ms = (sum(v[i] for t, v in after.items() if t.startswith(claim))
                     - sum(v[i] for t, v in before.items() if t.startswith(claim)) for i in (0, 1))
        got["claim"] = {"calls": calls, "exec_ms_per_call": round(ms / calls, 4) if calls else None}
    for arrival in noisy_neighbour.ARRIVALS:
        m = got[arrival]
        if m["done"] != m["jobs"] or m["duplicates"]:
            raise RuntimeError(f"bench {name}, {arrival}: {m['done']} of {m['jobs']} jobs done, "
                               f"{m['duplicates']} run twice")
    out[name] = got
    return float(got["during_drain"]["jobs_per_s"])


#: Each policy's claim statement, by its first words as pg_stat_statements keeps them.
CLAIMS = {"fifo": "update jobqueue.jobs set status = $", "round-robin": "with recursive tenants",
          "limit": "with busy as"}


def noisy_jobs(burst: int) -> int:
    """Return the jobs of one noisy row: both arrivals of the burst and the 99 small jobs."""
    from .experiments import noisy_neighbour

    return 2 * (burst + 99 * noisy_neighbour.Knobs().small_jobs)


def _noisy_ratios(jps: dict[str, float], rounds: dict[str, Any]) -> dict[str, float]:
    """Return one round's noisy-neighbour ratios: each fair policy's jobs/s against FIFO's
    (``noisy_<policy>_vs_fifo``: 0.9 = costs 10 %) and how many times lower its small tenants'
    p95 wait is, arriving during the drain (``noisy_<policy>_p95_cut``)."""
    from .experiments import noisy_neighbour

    out = {}
    for name in ("noisy_round_robin", "noisy_limit"):
        if name not in jps or "noisy_fifo" not in jps:
            continue
        out[f"{name}_vs_fifo"] = round(jps[name] / jps["noisy_fifo"], 3)
        out[f"{name}_p95_cut"] = round(noisy_neighbour.ratio_of(
            rounds["noisy_fifo"]["during_drain"], rounds[name]["during_drain"]), 3)
    return out


def _noisy_details(rounds: list[dict[str, Any]]) -> dict[str, str]:
    """Return what the noisy-neighbour rows measured beyond their profiles, medians over the
    rounds: each claim's execution per call, and the drain's two phases (several tenants with
    work, then the burst's alone) arriving during the drain."""
    def med(*path: str) -> float | None:
        values = bench_profile.round_values(rounds, *path)
        return statistics.median(values) if values else None

    out = {}
    for name in ("noisy_round_robin", "noisy_limit"):
        if not any(name in r for r in rounds):
            continue
        parts = []
        fair, fifo = (med(n, "claim", "exec_ms_per_call") for n in (name, "noisy_fifo"))
        if fair is not None and fifo is not None:
            parts.append(f"its claim executes in {fair:.3f} ms a call against FIFO's "
                         f"{fifo:.3f} (pg_stat_statements)")
        several, several_n, alone, alone_n = (
            med(name, "during_drain", f"{phase}_{what}")
            for phase in ("several_tenants", "burst_alone") for what in ("jobs_per_s", "jobs"))
        fifo_rate = med("noisy_fifo", "during_drain", "jobs_per_s")
        if None not in (several, alone, fifo_rate, several_n, alone_n):
            parts.append(f"while several tenants have work {several:,.0f} jobs/s "
                         f"({several_n:,.0f} jobs), the burst's tenant alone {alone:,.0f} jobs/s "
                         f"({alone_n:,.0f} jobs), FIFO {fifo_rate:,.0f} jobs/s throughout")
        if name == "noisy_limit":
            # The policy itself: one running job per tenant, so the burst's tenant alone keeps
            # one worker busy, whatever the others could do.
            parts.append("limit=1 runs one job of a tenant at a time: with the burst's tenant "
                         "alone one worker works, by design")
        if parts:
            out[f"{name}_vs_fifo"] = "; ".join(parts)
    return out


def processes(s: db.Scratch, workers: int, jobs: int, *extra: str) -> float:
    """Drain `jobs` no-op jobs with `workers` worker processes; return jobs per second.

    The rate while all of them ran: from the last one's first job to the last finish (the
    jobs started in it); from the first start if the last came too late to see half the jobs.
    """
    _reset(s)
    with s.connect("worker", "bench enqueue", autocommit=True) as conn:
        queue.enqueue(conn, "noop", count=jobs)
    _mark("start")
    procs = [subprocess.Popen(_worker_argv("--until-empty", "--name", f"bench-{i}", *extra),
                              env=_env(s), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for i in range(workers)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"bench worker exited {p.returncode}: {err[-500:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    _mark("stop")
    with s.connect("worker", "bench span", autocommit=True) as conn:
        n, seconds = conn.execute(q("bench_span")).fetchone() or (0, None)
        # The rate while every worker runs: a worker still starting (importing, connecting)
        # while the first ones drain would count its start-up against the others.
        running, steady = conn.execute(q("bench_span_all_running")).fetchone() or (0, None)
    if n != jobs:
        raise RuntimeError(f"bench: {workers} workers ran {n} of {jobs} jobs")
    if running >= jobs // 2 and steady:
        return running / float(steady)
    return jobs / float(seconds)


def _rate(rates: list[float]) -> dict[str, Any]:
    m = statistics.median(rates)
    return {"jobs_per_s": round(m, 1), "ms_per_job": round(1000 / m, 3),
            "rounds": [round(r, 1) for r in rates],
            # the spread over the rounds (min, max): added, the keys above kept
            "jobs_per_s_range": [round(min(rates), 1), round(max(rates), 1)]}


def claims(p: db.Scratch, history: int, scheduled: int, backoff: int, exhausted: int,
           bulk_jobs: int, say: Callable[[str, Any], None]) -> dict[str, Any]:
    """Measure the claim's cost once: on the empty queue before and after the full history, the
    jobs not yet due, the exhausted ones and the bulk operations (their baseline: the mean of
    the two empty ones)."""
    before = claim_cost(p, 0)
    say("history 0", before)
    hist = {str(history): claim_cost(p, history)}
    say(f"history {history:,}", hist[str(history)])
    waiting = {"scheduled": scheduled, "backoff": backoff}
    not_due: dict[str, Any] = dict(waiting, **claim_cost(p, 0, **waiting))
    say("not yet due", not_due)
    spent: dict[str, Any] = {"exhausted": exhausted}
    if exhausted:
        spent.update(claim_cost(p, 0, exhausted=exhausted))
        say("exhausted, unreaped", spent)
    bulk = claim_after_bulk(p, bulk_jobs) if bulk_jobs else {}
    say("claim after bulk", bulk)
    after = claim_cost(p, 0)
    say("history 0 again", after)
    hist["0"] = {k: round((before[k] + after[k]) / 2, 3) for k in before}
    return {"history": hist, "not_due": not_due, "exhausted": spent, "bulk": bulk}


def _median_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the documents' values, numbers as their median over the rounds (others: the first)."""
    out: dict[str, Any] = {}
    for k, v in docs[0].items():
        if isinstance(v, dict):
            out[k] = _median_of([d[k] for d in docs])
        elif isinstance(v, int) and not isinstance(v, bool):
            out[k] = statistics.median_low(d[k] for d in docs)  # counts (buffers, jobs) stay whole
        elif isinstance(v, float):
            out[k] = round(statistics.median(d[k] for d in docs), 3)
        else:
            out[k] = v
    return out


def _round_ratios(jps: dict[str, float], c: dict[str, Any], history: int,
                  ceiling: dict[str, float] | None) -> dict[str, float]:
    """Return one round's ratios: its rows' rates and its claims against each other."""
    return {**_ratios(jps, c["history"], history, c["not_due"], c["exhausted"]),
            **_bulk_ratios(c["bulk"], c["history"]), **_routing_ratios(jps),
            **_ceiling_ratios(jps, ceiling)}


def turn(names: Any, i: int) -> list[Any]:
    """Return `names` in order, turned by `i` places: round i starts at its i-th (mod len)."""
    items = list(names)
    k = i % len(items) if items else 0
    return items[k:] + items[:k]


def _claim_details(hist: dict[str, Any], history: int, not_due: dict[str, Any],
                   spent: dict[str, Any], bulk: dict[str, Any]) -> dict[str, str]:
    """Return what each claim target measured (medians over the rounds), for its why line."""
    base = hist["0"]

    def vs(v: dict[str, Any], what: str, key: str = "claim_ms") -> str:
        return f"median claim {v[key]:.3f} ms {what} against {base[key]:.3f} ms without"

    out = {"claim_at_history_vs_0": vs(hist[str(history)], f"with {history:,} finished jobs"),
           "claim_empty_at_history_vs_0": vs(hist[str(history)], "on an empty queue with the "
                                             "history", "claim_ms_empty_queue"),
           "claim_not_due_vs_0": vs(not_due, "behind the jobs not yet due"),
           "claim_empty_not_due_vs_0": vs(not_due, "on an empty queue behind them",
                                          "claim_ms_empty_queue")}
    if "claim_ms" in spent:
        out["claim_exhausted_vs_0"] = vs(spent, "behind the exhausted jobs")
        out["claim_empty_exhausted_vs_0"] = vs(spent, "on an empty queue behind them",
                                               "claim_ms_empty_queue")
    if bulk:
        out["claim_after_bulk_vs_claim"] = (
            f"first claims {bulk['claim_after_bulk_ms']:.3f} ms, the first reading "
            f"{bulk['claim_after_bulk_buffers']} buffers, against {base['claim_ms']:.3f} ms")
        out["claim_after_retry_dead_vs_claim"] = (
            f"first claims {bulk['claim_after_retry_dead_ms']:.3f} ms, the first reading "
            f"{bulk['claim_after_retry_dead_buffers']} buffers, against {base['claim_ms']:.3f} ms")
    return out


def run(jobs: int = 2000, rounds: int = 3, history: int = 100_000, workers: int = 4,
        peers: bool = False, progress: Callable[[str, Any], None] | None = None,
        scheduled: int = 100_000, backoff: int = 10_000, exhausted: int = 1_000,
        bulk_jobs: int = BULK, tenants: int = TENANTS,
        noisy_burst: int = NOISY_BURST) -> dict[str, Any]:
    """Measure everything `rounds` times; return the JSON document ``tenantlab bench --json``
    writes (``noisy_burst`` 0: without the noisy-neighbour rows)."""
    global _profiler
    say = progress or (lambda name, value: None)
    drift: dict[str, Any] = {}
    counts = sorted({1, 2, 4, 8} & set(range(1, workers + 1)) | {workers})
    peer_names: list[str] = []
    peer_notes: dict[str, str] = {}
    peer_docs: dict[str, str] = {}
    if peers:
        from . import bench_peers

        peer_names = bench_peers.installed(say)
        peer_notes, peer_docs = bench_peers.DURABILITY, bench_peers.DOCS
    started_at = time.monotonic()
    with db.scratch("bench") as s, product_db() as p:
        profiler = bench_profile.Profiler(db.admin_dsn())
        try:
            drain(s, "single", min(jobs, 200))  # warm up: caches, plans, the first connection
            drain(p, "leased", min(jobs, 200))
            pgbench = bench_ceiling.pgbench()
            ceilings = [f"ceiling_{k}" for k in CEILINGS] if pgbench else []
            names = ["select1", "commit1", *ceilings, *DESIGNS, *LOOPS, *ROUTING, "enqueue_one",
                     "enqueue_many",
                     *peer_names, *(f"workers_{w}" for w in counts),
                     *(NOISY if noisy_burst else ())]
            runs: dict[str, list[float]] = {name: [] for name in names}
            prof: dict[str, list[dict[str, float | None]]] = {}
            claim_rounds: list[dict[str, Any]] = []
            noisy_rounds: list[dict[str, Any]] = []
            whole_runs: dict[str, list[float]] = {}

            def measure(name: str, n: int, rate: Callable[..., Any], *args: Any) -> None:
                # The server's counters between the two readings (every session, every
                # database but the profiler's): this row's own.
                global _profiler
                cpu0 = cpu_seconds()
                profiler.begin()
                _profiler = profiler
                try:
                    r = rate(*args)
                finally:
                    _profiler = None
                counted = profiler.end(n)
                if not isinstance(r, dict):  # a rate alone: the CPU of the whole call
                    r = {"jobs_per_s": r, "cpu_ms_per_job": (cpu_seconds() - cpu0) * 1000 / n}
                runs[name].append(r["jobs_per_s"])
                # Worker processes: their CPU is their whole lives (start-up too) over several
                # cores, their rate from the first job to the last: no rest to speak of.
                prof.setdefault(name, []).append(bench_profile.complete(
                    counted, r["jobs_per_s"], r["cpu_ms_per_job"],
                    serial=not name.startswith("workers_") and name not in NOISY))
                if "drift" in r:
                    drift.setdefault(name, []).append(r["drift"])
                if "jobs_per_s_whole" in r:
                    whole_runs.setdefault(name, []).append(r["jobs_per_s_whole"])
                say(name, runs[name][-1])

            # One round is every measurement once, in turn: a machine that is busier in one
            # phase than another shifts all of them alike, and each round's ratios hold. Within
            # each group the order turns by one each round (a row and its control each take
            # every place in turn): what the row before leaves behind (autovacuum of its table,
            # a checkpoint's full-page writes) falls on each of them alike.
            for i in range(rounds):
                say("round", f"{i + 1} of {rounds}")
                loops = max(jobs, 2000)
                measure("select1", loops, select1, s, loops)
                measure("commit1", loops, commit1, s, loops)
                for name in turn(ceilings, i):
                    measure(name, jobs, bench_ceiling.run, p, jobs, CEILINGS[name[8:]], pgbench)
                for name in turn(DESIGNS, i):
                    measure(name, jobs, drain, s, name, jobs)
                for name in turn(LOOPS, i):
                    measure(name, max(jobs, tenants), drain, p, name, jobs, tenants)
                for name in turn(ROUTING, i):
                    measure(name, jobs, drain_routing, p, name, jobs)
                for name, rate in enqueue_rates(p, jobs).items():
                    runs[name].append(rate)
                    say(name, rate)
                for name in turn(peer_names, i):
                    measure(name, jobs, bench_peers.drain, name, jobs, _stop)
                for w in turn(counts, i):
                    measure(f"workers_{w}", jobs, processes, p, w, jobs)
                noisy_rounds.append({})
                for name in turn(NOISY, i) if noisy_burst else ():
                    measure(name, noisy_jobs(noisy_burst), noisy, s, name, noisy_burst,
                            noisy_rounds[-1])
                claim_rounds.append(claims(p, history, scheduled, backoff, exhausted,
                                           bulk_jobs, say))
            latency = {}
            for name, listen in (("leased", True), ("leased_poll", False)):
                latency[name] = idle_latency(p, listen)
                say(f"idle latency {name}", latency[name])
            wake = wake_transactions(p)
            say("wake-ups", wake)
            settings = _settings(s)
            statements = profiler.statements
        finally:
            profiler.close()
    results = {name: _rate(v) for name, v in runs.items()}
    scaling = {str(w): results[f"workers_{w}"]["jobs_per_s"] for w in counts}
    jps = {k: v["jobs_per_s"] for k, v in results.items()}
    ceiling = {k: jps[f"ceiling_{k}"] for k in CEILINGS if f"ceiling_{k}" in jps} or None
    c = _median_of(claim_rounds)
    hist, not_due, spent, bulk = c["history"], c["not_due"], c["exhausted"], c["bulk"]
    # Each round's ratios, from that round's rows and claims; a target is judged on the median.
    ratio_rounds: dict[str, list[float]] = {}
    for i, cr in enumerate(claim_rounds):
        jps_i = {k: v[i] for k, v in runs.items()}
        ceiling_i = {k: jps_i[f"ceiling_{k}"] for k in CEILINGS if f"ceiling_{k}" in jps_i}
        for k, v in (_round_ratios(jps_i, cr, history, ceiling_i or None)
                     | _noisy_ratios(jps_i, noisy_rounds[i])).items():
            ratio_rounds.setdefault(k, []).append(v)
    profile_rounds = {name: {m: [x.get(m) for x in v] for m in bench_profile.METRICS}
                      for name, v in prof.items()}
    profile = {name: {m: (None if (r := bench_profile.median_range(vs)) is None
                          else round(r["median"], 4)) for m, vs in ms.items()}
               for name, ms in profile_rounds.items()}
    targets = bench_profile.judge(ratio_rounds, profile,
                                  _claim_details(hist, history, not_due, spent, bulk)
                                  | _noisy_details(noisy_rounds))
    notes = DURABILITY | peer_notes
    flushes = {k: v["wal_flushes_per_job"] for k, v in profile.items()
               if v["wal_flushes_per_job"] is not None}
    cpu = {k: v["client_cpu_ms_per_job"] for k, v in profile.items()
           if v["client_cpu_ms_per_job"] is not None}
    return {
        "server_version": db.server_version(), "jobs": jobs, "rounds": rounds,
        # the worker loops' jobs (leased, leased_round_robin, leased_limit, ...) are spread over
        # this many tenants, max(jobs, tenants) jobs each run
        "tenants": tenants,
        "settings": settings,
        # each row: jobs_per_s (median over the rounds), ms_per_job, rounds (each round's
        # jobs/s, in order) and jobs_per_s_range ([min, max])
        "results": results,
        # the worker's own claim and finish statements run by pgbench, no Python between them
        # (bench_ceiling): jobs/s at one job per transaction and at BATCH; null without pgbench
        "ceiling": ceiling,
        # the claims: medians over the rounds (claim_rounds: each round's)
        "history": hist,
        # the claim with jobs in front of the ready ones that it must not take: not yet due
        # (scheduled, in backoff), or exhausted and unreaped; their counts, then ms. The
        # baseline of both is history["0"].
        "not_due": not_due,
        "exhausted": spent,
        # the first claims right after enqueue_many of `jobs` jobs and after retry --dead of
        # as many, on the statistics of before (median ms, buffers of the first); its baseline
        # is claim_ms (history["0"]); {} when --bulk 0
        "claim_after_bulk": bulk | ({"claim_ms": hist["0"]["claim_ms"]} if bulk else {}),
        "claim_rounds": claim_rounds,
        # measured once per run, after the rounds
        "idle_latency_ms": latency,
        # server transactions per job queued one at a time while WAKE_WORKERS workers are idle
        # (issue 32, item 5); claims_per_job: the workers' claims of their own per job (1: one
        # wake-up per job; before the wake chain every idle worker woke and claimed)
        "wake": wake,
        # the noisy neighbour's rows (noisy_fifo, noisy_round_robin, noisy_limit): its burst,
        # and each round's measures per row and arrival (during_drain: the rows' jobs/s;
        # queued_first), as `reproduce noisy-neighbour` reports them; {} when --noisy 0
        "noisy_neighbour": ({"burst": noisy_burst, "rounds": noisy_rounds}
                            if noisy_burst else {}),
        "scaling": scaling,
        # the worker and design rows from the worker's start to its end, start-up and
        # shut-down included (results: from the first job's execution to the last, as the
        # peers'), median over the rounds
        "jobs_per_s_whole": {k: round(statistics.median(v), 1) for k, v in whole_runs.items()},
        # a run's last tenth's rate over its first's: 1.0 = flat while finished jobs pile up
        "drift": {k: round(statistics.median(v), 3) for k, v in drift.items()},
        # the median over the rounds of each round's ratio (ratio_rounds: each round's)
        "ratios": {k: round(statistics.median(v), 3) for k, v in ratio_rounds.items()},
        "ratio_rounds": ratio_rounds,
        # each target: median ratio, min, max, rounds, met (on the median) and, when missed,
        # why: one line from the two rows' profiles (bench_profile.TARGETS)
        "targets": targets,
        # per row and job, median over the rounds (profile_rounds: each round's): wall ms,
        # client CPU ms, server active ms (pg_stat_database.active_time: parse, plan, execute,
        # commit and its WAL flush), rest ms (wall less both: round trips, waiting), statements
        # and their execution ms (pg_stat_statements; null where the server does not load it),
        # transactions, WAL flushes, machine CPU busy (0-1, all cores, /proc/stat). A peer's
        # counts include its set-up (schema, enqueue); a drain's of the kit do not.
        "profile": profile,
        "profile_rounds": profile_rounds,
        "statements_available": statements,
        "cores": os.cpu_count(),
        "seconds": round(time.monotonic() - started_at, 1),
        # WAL flushes per job (per commit for commit1), median over the rounds, counted
        # server-wide (pg_stat_wal): what each row's durability costs, as measured
        "wal_flushes_per_job": {k: round(v, 3) for k, v in flushes.items()},
        # the client's CPU per job (ms, median): this process and its threads while a row ran
        # in it (a peer: from its first job to its last), the worker processes' whole lives
        "client_cpu_ms_per_job": {k: round(v, 3) for k, v in cpu.items()},
        # what a crash right after a job can lose: flush per job or per batch, by each row's code
        "durability": {k: notes[k] for k in results if k in notes}
        | {k: DURABILITY["workers"] for k in results if k.startswith("workers_") or k in NOISY},
        "docs": {k: v for k, v in peer_docs.items() if k in results},
        # kept from the first bench (add, never rename)
        "repeats": rounds,
        "jobs_per_second": jps,
        "ms_per_job": {k: v["ms_per_job"] for k, v in results.items()},
        "cost_ratio_leased_vs_single": round(jps["single"] / jps["leased"], 3),
        "cost_ratio_durable_claim_vs_single": round(jps["single"] / jps["leased"], 3),
        "runs": {k: v["rounds"] for k, v in results.items()},
    }


def compare(jobs: int = 400, rounds: int = 2) -> Any:
    """Return a small live comparison for notebook 09: jobs/s of each design on this server.

    The naive single transaction, the corrected worker loop (durable claim), with a heartbeat,
    and with ``--batch 10``; each measured ``rounds`` times in turn, the median kept, and its
    per-job cost next to ``single``'s. procrastinate, PgQueuer and awa: ``tenantlab bench --peers``.
    """
    import pandas as pd

    names = ["single", "leased", "leased_heartbeat", "leased_batch"]
    rates: dict[str, list[float]] = {n: [] for n in names}
    with db.scratch("bench") as s, product_db() as p:
        drain(s, "single", min(jobs, 100))  # warm up
        for _ in range(rounds):
            for n in names:
                rates[n].append(drain(p if n in LOOPS else s, n, jobs)["jobs_per_s"])
    med = {n: statistics.median(v) for n, v in rates.items()}
    return pd.DataFrame([{"design": n, "jobs/s": round(med[n]),
                          "cost per job vs single": f"{med['single'] / med[n]:.2f}x"}
                         for n in names])


def _ratios(jps: dict[str, float], hist: dict[str, Any], history: int,
            not_due: dict[str, Any], spent: dict[str, Any]) -> dict[str, float]:
    out = {
        "leased_cost_vs_single": jps["single"] / jps["leased"],
        "leased_heartbeat_vs_leased": jps["leased_heartbeat"] / jps["leased"],
        # What the default heartbeat costs: the worker with it against the worker without.
        "leased_vs_no_heartbeat": jps["leased"] / jps["leased_no_heartbeat"],
        "leased_batch_vs_leased": jps["leased_batch"] / jps["leased"],
        # The fair claims against FIFO over the same tenants (--tenants): 1.0 = cost nothing.
        "leased_round_robin_vs_leased": jps["leased_round_robin"] / jps["leased"],
        "leased_limit_vs_leased": jps["leased_limit"] / jps["leased"],
        "claim_at_history_vs_0": hist[str(history)]["claim_ms"] / hist["0"]["claim_ms"],
        "leased_vs_leased_run_one": jps["leased"] / jps["leased_run_one"],
        "claim_empty_at_history_vs_0": (hist[str(history)]["claim_ms_empty_queue"]
                                        / hist["0"]["claim_ms_empty_queue"]),
        "claim_not_due_vs_0": not_due["claim_ms"] / hist["0"]["claim_ms"],
        "claim_empty_not_due_vs_0": (not_due["claim_ms_empty_queue"]
                                     / hist["0"]["claim_ms_empty_queue"]),
    }
    if "claim_ms" in spent:
        out["claim_exhausted_vs_0"] = spent["claim_ms"] / hist["0"]["claim_ms"]
        out["claim_empty_exhausted_vs_0"] = (spent["claim_ms_empty_queue"]
                                             / hist["0"]["claim_ms_empty_queue"])
    if "workers_4" in jps and "workers_1" in jps:
        out["workers_4_vs_1"] = jps["workers_4"] / jps["workers_1"]
    if "workers_8" in jps and "workers_4" in jps:
        out["workers_8_vs_4"] = jps["workers_8"] / jps["workers_4"]
    if "commit1" in jps:
        # The floor: one round trip and one WAL flush per job; how close each loop comes to it.
        out["leased_vs_commit1"] = jps["leased"] / jps["commit1"]
        out["single_vs_commit1"] = jps["single"] / jps["commit1"]
    for peer in ("procrastinate", "pgqueuer", "pgqueuer_psycopg", "awa", "awa_one"):
        if peer in jps:
            out[f"leased_vs_{peer}"] = jps["leased"] / jps[peer]
            out[f"leased_batch_vs_{peer}"] = jps["leased_batch"] / jps[peer]
            out[f"leased_batch_commit_vs_{peer}"] = jps["leased_batch_commit"] / jps[peer]
    return {k: round(v, 3) for k, v in out.items()}


def _bulk_ratios(bulk: dict[str, Any], hist: dict[str, Any]) -> dict[str, float]:
    if not bulk:
        return {}
    base = hist["0"]["claim_ms"]
    return {"claim_after_bulk_vs_claim": round(bulk["claim_after_bulk_ms"] / base, 3),
            "claim_after_retry_dead_vs_claim": round(bulk["claim_after_retry_dead_ms"] / base, 3)}


def _ceiling_ratios(jps: dict[str, float], ceiling: dict[str, float] | None) -> dict[str, float]:
    """Return every row as a share of the ceiling: ``<row>_vs_ceiling`` (one job per
    transaction) and ``<row>_vs_ceiling_batch`` (BATCH per transaction)."""
    if not ceiling:
        return {}
    out = {}
    for name, rate in jps.items():
        if name.startswith("ceiling_"):
            continue
        if "one" in ceiling:
            out[f"{name}_vs_ceiling"] = round(rate / ceiling["one"], 3)
        if "batch" in ceiling:
            out[f"{name}_vs_ceiling_batch"] = round(rate / ceiling["batch"], 3)
    return out


def _settings(s: db.Scratch) -> dict[str, str]:
    with s.connect("admin", "bench settings", autocommit=True) as c:
        return {name: db.scalar(c, q("bench_setting"), {"name": name})
                for name in ("fsync", "synchronous_commit")}


#: Rows a bench flag may ask for at most (ten million: minutes of inserts already).
MAX_ROWS = 10_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the benchmark's flags (``tenantlab bench``)."""
    p.add_argument("--jobs", type=count("jobs", most=1_000_000), default=2000,
                   help="no-op jobs per run (default 2000)")
    p.add_argument("--rounds", "--repeats", dest="rounds", type=count("rounds", most=100),
                   default=3,
                   help="runs per design; medians are reported (default 3)")
    p.add_argument("--history", type=count("history", most=MAX_ROWS), default=100_000,
                   help="finished jobs under the claim for the history measurement (default 100,000)")
    p.add_argument("--scheduled", type=number(int, "scheduled", zero=True, most=MAX_ROWS),
                   default=100_000,
                   help="jobs scheduled for tomorrow in front of the ready ones (default 100,000)")
    p.add_argument("--backoff", type=number(int, "backoff", zero=True, most=MAX_ROWS),
                   default=10_000,
                   help="jobs in backoff (due in 5 minutes) in front of them too (default 10,000)")
    p.add_argument("--exhausted", type=number(int, "exhausted", zero=True, most=MAX_ROWS),
                   default=1_000,
                   help="running jobs with their lease out and attempts spent, not yet reaped, "
                        "in front of the ready ones, measured apart (default 1,000; 0: not)")
    p.add_argument("--tenants", type=count("tenants", most=1_000_000), default=TENANTS,
                   help="tenants the worker loops' jobs are spread over (leased, "
                        "leased_round_robin, leased_limit, ...; default 100; at least one job "
                        "each)")
    p.add_argument("--bulk", type=number(int, "bulk", zero=True, most=MAX_ROWS), default=BULK,
                   help="jobs of the enqueue_many and the retry --dead before the first claims "
                        "are timed (default 100,000; 0: not)")
    p.add_argument("--noisy", type=number(int, "noisy", zero=True, most=10_000),
                   default=NOISY_BURST,
                   help="the noisy neighbour's burst (one tenant, in front of 99 small tenants' "
                        "jobs), drained per claim policy by worker processes (default 1,000, "
                        "the workshop's; 0: not)")
    p.add_argument("--workers", type=count("workers", most=64), default=4,
                   help="worker processes at most for the scaling run (1, 2, 4, 8 up to W)")
    p.add_argument("--peers", action="store_true",
                   help="also procrastinate, PgQueuer and awa with their defaults (installed with "
                        "the dev or bench extra)")
    p.add_argument("--json", metavar="FILE", type=output_file,
                   help="also write the result as JSON")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="tenantlab bench", description=__doc__)
    add_arguments(p)
    return cmd_bench(p.parse_args(argv))


def report(r: dict[str, Any]) -> list[str]:
    """Return the rows' lines: jobs/s median (range over the rounds), then each row's profile
    per job (wall = client CPU + server active + rest)."""
    out = []
    for name, v in r["results"].items():
        rng = bench_profile.fmt_range(v["rounds"])
        out.append(f"  {name:24} {rng:>24} jobs/s  {v['ms_per_job']:.3f} ms/job")
        if pr := r.get("profile", {}).get(name):
            out.append("  " + " " * 24 + "  per job: " + profile_line(pr))
    if not r.get("statements_available", True):
        out.append("  (statements per job: not available, the server does not load "
                   "pg_stat_statements; transactions per job from pg_stat_database instead)")
    return out


def profile_line(pr: dict[str, Any]) -> str:
    """Return one row's profile per job as text (what is not known is left out)."""
    parts = []
    for key, text, spec in (("wall_ms_per_job", "wall {} ms", ".3f"),
                            ("client_cpu_ms_per_job", "= client CPU {}", ".3f"),
                            ("server_active_ms_per_job", "+ server {}", ".3f"),
                            ("rest_ms_per_job", "+ rest {}", ".3f"),
                            ("statements_per_job", "; {} statements", ".1f"),
                            ("server_exec_ms_per_job", "(executing {} ms)", ".3f"),
                            ("transactions_per_job", "{} transactions", ".2f"),
                            ("wal_flushes_per_job", "{} WAL flushes", ".2f"),
                            ("machine_cpu_busy", "machine CPU busy {}", ".0%")):
        if pr.get(key) is not None:
            parts.append(text.format(format(pr[key], spec)))
    return " ".join(parts)


def claim_ms(r: dict[str, Any], *path: str) -> str:
    """Return a claim's ms over the rounds, median (min-max), from ``claim_rounds``."""
    return bench_profile.fmt_range(bench_profile.claim_values(r, *path), ".3f")


def target_lines(r: dict[str, Any]) -> list[str]:
    """Return the targets: median ratio, range over the rounds, met on the median; a why line
    under each missed one."""
    out = []
    texts = {key: text for key, text, _ok, _pair in bench_profile.TARGETS}
    for key, t in r.get("targets", {}).items():
        rng = bench_profile.fmt_range(t, ".2f", "x")
        out.append(f"  {'✓' if t['met'] else '✗'} {texts[key]}: {rng}")
        if "why" in t:
            out.append(f"      why: {t['why']}")
    return out


def shown(value: Any) -> str:
    """Return a progress line's value as words: a rate, or a measurement's parts (never a
    dict's repr)."""
    if isinstance(value, float):
        return f"{value:8.0f} jobs/s"
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')} {v:,g}" if isinstance(v, float) else
                         f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else
                         f"{k.replace('_', ' ')} {v}" for k, v in value.items())
    return str(value)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run ``tenantlab bench`` with parsed arguments."""
    def progress(name: str, value: Any) -> None:
        print(f"  {name:24} {shown(value)}", file=sys.stderr, flush=True)

    r = run(args.jobs, args.rounds, args.history, args.workers, args.peers, progress,
            args.scheduled, args.backoff, args.exhausted, args.bulk, args.tenants, args.noisy)
    print(f"PostgreSQL {r['server_version']} (fsync {r['settings']['fsync']}, synchronous_commit "
          f"{r['settings']['synchronous_commit']}), {r['jobs']} no-op jobs, median of "
          f"{r['rounds']} rounds (min-max), in {r['seconds']:.0f} s")
    for line in report(r):
        print(line)
    if r["ceiling"]:
        print("  ceiling (the worker's claim and finish in pgbench, no Python): "
              + ", ".join(f"{k} {v:,.0f} jobs/s" for k, v in r["ceiling"].items()))
    def ms(*path: str) -> str:
        return claim_ms(r, *path) + " ms"

    for h in r["history"]:
        print(f"  claim with {int(h):>9,} finished jobs: {ms('history', h, 'claim_ms')} "
              f"({ms('history', h, 'claim_ms_empty_queue')} on an empty queue)")
    nd, ex = r["not_due"], r["exhausted"]
    print(f"  claim behind {nd['scheduled']:,} scheduled, {nd['backoff']:,} in backoff: "
          f"{ms('not_due', 'claim_ms')} ({ms('not_due', 'claim_ms_empty_queue')} on an empty "
          "queue)")
    if "claim_ms" in ex:
        print(f"  claim behind {ex['exhausted']:,} exhausted, unreaped: "
              f"{ms('exhausted', 'claim_ms')} ({ms('exhausted', 'claim_ms_empty_queue')} on an "
              "empty queue)")
    if b := r["claim_after_bulk"]:
        print(f"  first claims after enqueue_many of {b['jobs']:,}: "
              f"{ms('bulk', 'claim_after_bulk_ms')} ({b['claim_after_bulk_buffers']} buffers), "
              f"after retry --dead: {ms('bulk', 'claim_after_retry_dead_ms')} "
              f"({b['claim_after_retry_dead_buffers']} buffers), against {b['claim_ms']:.3f} ms")
    w = r["wake"]
    print(f"  {w['workers']} idle workers: {w['transactions_per_job']:.1f} server transactions per "
          "job queued" + ("" if w.get("claims_per_job") is None else
                          f", {w['claims_per_job']:.1f} claims of the workers' own per job"))
    for name, got in (r.get("noisy_neighbour") or {}).get("rounds", [{}])[-1].items():
        m = got["during_drain"]
        print(f"  noisy neighbour {NOISY[name]:12} (last round) small tenants' p95 wait "
              f"{m['small_tenants_wait_p95_s']:.3f} s, the burst's {m['noisy_tenant_wait_p95_s']:.3f} s")
    for name, v in r["idle_latency_ms"].items():
        print(f"  idle latency {name:12} median {v['median']:.1f} ms, p95 {v['p95']:.1f} ms")
    for name, v in r["ratios"].items():
        print(f"  {name:32} {v:.2f}x" + ("" if len(rr := r["ratio_rounds"][name]) < 2 else
                                         f"  ({min(rr):.2f}-{max(rr):.2f}x)"))
    for line in target_lines(r):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
