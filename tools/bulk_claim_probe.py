"""What a running worker meets right after a bulk operation (issue 32, item 4): before and after
jobqueue's fixes, alternating in one run, on the kit's server (``tenantlab up``).

    nice -n 10 .venv/bin/python tools/bulk_claim_probe.py [ROUNDS] [JOBS]

Each round, in turn (the order flipped every round), with and without the two fixes (the
bulk's analyze, ``BULK_ANALYZE``; the claim's batch size written in, ``_limit_written``):

- ``claim_ms``: the bench's steady claim (``bench.claim_cost``, 500 claims, median);
- ``bulk``: ``bench.claim_after_bulk``: a worker running before the bulk (its claim prepared,
  its plan kept) after ``enqueue_many`` of JOBS from another connection, and after ``retry
  --dead`` of JOBS: the first claim's buffers, the next 20 claims' median;
- ``fresh``: the measure the bench had before: a connection opened after the bulk (planned
  afresh), median of its first 20 claims;
- ``loop``: the worker's own loop (finish and next claim in one commit), ms per job, before
  the bulk and for the 40 jobs after it.

Not a test: timings on a shared machine; read the ratios within a round.
"""

from __future__ import annotations

import statistics
import sys
import time

import jobqueue.enqueue  # noqa: F401  (the modules, not the functions the package exports)
import jobqueue.leased  # noqa: F401
import jobqueue.ops  # noqa: F401
import psycopg
from jobqueue import Leased, enqueue_many

from tenantlab import bench, db, kinds, queue
from tenantlab.queries import q

ENQUEUE = sys.modules["jobqueue.enqueue"]
OPS = sys.modules["jobqueue.ops"]
LEASED = sys.modules["jobqueue.leased"]
LIMIT_WRITTEN = LEASED._limit_written


def fixes(on: bool) -> None:
    ENQUEUE.BULK_ANALYZE = OPS.BULK_ANALYZE = 1000 if on else 10**12
    LEASED._limit_written = LIMIT_WRITTEN if on else (lambda query, n: query)


def fresh(p: db.Scratch, jobs: int) -> float:
    bench._reset(p)
    with p.connect("admin", "probe", autocommit=True) as admin:
        admin.execute(q("bench_analyze_jobs"))
    leased = Leased(kinds.handlers, lease=30.0, heartbeat=None)
    with p.connect("worker", "probe fresh", autocommit=True) as conn:
        enqueue_many(conn, [{"kind": "noop", "tenant": 1 + i % 100} for i in range(jobs)])
        return statistics.median(bench._timed_claims(conn, leased, 20)) * 1000


def _loop(conn: psycopg.Connection, leased: Leased, n: int) -> list[float]:
    claim, out = leased.claim(conn), []
    for _ in range(n):
        assert claim is not None
        t = time.perf_counter()
        outcome = leased.run_claimed(conn, claim, lambda c, j: None, claim_next=1)
        out.append((time.perf_counter() - t) * 1000)
        claim = outcome.claimed[0] if outcome.claimed else None
    return out


def loop(p: db.Scratch, jobs: int) -> tuple[float, float]:
    bench._reset(p)
    with p.connect("admin", "probe", autocommit=True) as admin:
        admin.execute(q("bench_analyze_jobs"))
    leased = Leased(kinds.handlers, lease=30.0, heartbeat=None)
    with p.connect("worker", "probe worker", autocommit=True) as conn, \
            p.connect("worker", "probe app", autocommit=True) as app:
        queue.enqueue(app, "noop", count=31)
        before = _loop(conn, leased, 30)
        enqueue_many(app, [{"kind": "noop", "tenant": 1 + i % 100} for i in range(jobs)])
        after = _loop(conn, leased, 40)
    return statistics.median(before[10:]), statistics.median(after)


def main(rounds: int, jobs: int) -> None:
    with bench.product_db() as p:
        for r in range(rounds):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                fixes(on)
                base = bench.claim_cost(p, 0)["claim_ms"]
                b = bench.claim_after_bulk(p, jobs)
                old = fresh(p, jobs)
                before, after = loop(p, jobs)
                print(f"round {r + 1} {'fixed ' if on else 'before'}: claim_ms {base:.3f}; bulk: "
                      f"enqueue_many {b['claim_after_bulk_ms']:.3f} ms "
                      f"({b['claim_after_bulk_ms'] / base:.2f}x, {b['claim_after_bulk_buffers']} "
                      f"buffers), retry --dead {b['claim_after_retry_dead_ms']:.3f} ms "
                      f"({b['claim_after_retry_dead_ms'] / base:.2f}x, "
                      f"{b['claim_after_retry_dead_buffers']} buffers); fresh {old:.3f} ms "
                      f"({old / base:.2f}x); loop {before:.2f} -> {after:.2f} ms/job", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3,
         int(sys.argv[2]) if len(sys.argv) > 2 else bench.BULK)
