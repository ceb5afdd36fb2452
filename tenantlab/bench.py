"""Measure what the corrected queue costs per job: no-op jobs through each design, one worker.

``tenantlab bench`` (or ``make bench``): in one process and one scratch database,
queue N no-op jobs, drain them with one design on one connection, and repeat, alternating the
designs; report the median jobs per second of each and the ratio leased / single transaction.
Not a test: timings depend on the machine. The leased design commits twice per job; by default
its claim skips its own WAL flush (see ``Leased.claim``), ``leased_durable_claim`` does not, so
the difference between the two is the price of a second fsync.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from . import db, queue
from .jobqueue.options import count
from .queries import q

DESIGNS: dict[str, Callable[[], queue.Design]] = {
    "single": lambda: queue.SingleTransaction(handle_errors=True),
    "leased": lambda: queue.Leased(lease=30.0, backoff=1.0),
    "leased_durable_claim": lambda: queue.Leased(lease=30.0, backoff=1.0, durable_claim=True),
}


def drain(scratch: db.Scratch, design: str, jobs: int) -> float:
    """Queue `jobs` no-op jobs, run them all with one design; return jobs per second."""
    with scratch.connect("admin", "bench reset", autocommit=True) as admin:
        admin.execute(q("reset_queue"))
    with scratch.connect("worker", f"bench {design}", autocommit=True) as conn:
        queue.enqueue(conn, "noop", count=jobs)
        d = DESIGNS[design]()
        started = time.perf_counter()
        done = 0
        while d.run_one(conn) is not None:
            done += 1
        elapsed = time.perf_counter() - started
    if done != jobs:
        raise RuntimeError(f"bench {design}: ran {done} of {jobs} jobs")
    return jobs / elapsed


def run(jobs: int = 2000, repeats: int = 5, progress: Any = None) -> dict[str, Any]:
    """Alternate the designs `repeats` times; return medians, every run, and the ratio."""
    runs: dict[str, list[float]] = {name: [] for name in DESIGNS}
    with db.scratch("bench") as s:
        drain(s, "single", min(jobs, 200))  # warm up: caches, plans, the first connection
        for _ in range(repeats):
            for name in DESIGNS:
                runs[name].append(drain(s, name, jobs))
                if progress:
                    progress(name, runs[name][-1])
        settings = _settings(s)
    median = {name: statistics.median(v) for name, v in runs.items()}
    return {
        "jobs": jobs, "repeats": repeats, "server_version": db.server_version(),
        "settings": settings,
        "jobs_per_second": {k: round(v, 1) for k, v in median.items()},
        "ms_per_job": {k: round(1000 / v, 3) for k, v in median.items()},
        # Cost per job of the corrected design relative to the naive one (> 1: slower).
        "cost_ratio_leased_vs_single": round(median["single"] / median["leased"], 3),
        "cost_ratio_durable_claim_vs_single": round(
            median["single"] / median["leased_durable_claim"], 3),
        "runs": {k: [round(x, 1) for x in v] for k, v in runs.items()},
    }


def _settings(s: db.Scratch) -> dict[str, str]:
    with s.connect("admin", "bench settings", autocommit=True) as c:
        return {name: db.scalar(c, q("bench_setting"), {"name": name})
                for name in ("fsync", "synchronous_commit")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the benchmark's flags (``tenantlab bench``)."""
    p.add_argument("--jobs", type=count("jobs"), default=2000, help="no-op jobs per run (default 2000)")
    p.add_argument("--repeats", type=count("repeats"), default=5, help="runs per design (default 5)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tenantlab bench", description=__doc__)
    add_arguments(p)
    return cmd_bench(p.parse_args(argv))


def cmd_bench(args: argparse.Namespace) -> int:
    """Run ``tenantlab bench`` with parsed arguments."""
    result = run(args.jobs, args.repeats,
                 progress=lambda name, rate: print(f"  {name:20} {rate:8.0f} jobs/s",
                                                   file=sys.stderr, flush=True))
    r = result
    print(f"PostgreSQL {r['server_version']} (fsync {r['settings']['fsync']}, synchronous_commit "
          f"{r['settings']['synchronous_commit']}), {r['jobs']} no-op jobs, median of "
          f"{r['repeats']} runs, one worker")
    for name in DESIGNS:
        print(f"  {name:20} {r['jobs_per_second'][name]:8.0f} jobs/s  "
              f"{r['ms_per_job'][name]:.3f} ms/job")
    print(f"  leased costs {r['cost_ratio_leased_vs_single']:.2f}x the single transaction per job "
          f"({r['cost_ratio_durable_claim_vs_single']:.2f}x with a durable claim: two fsyncs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
