"""Finding ``workers`` (beyond the article): 1, 2, 4, 8 worker processes on one queue.

Eight worker processes (``_claimers.py``) start once; each round, the first W of them drain the
same queue of no-op jobs, with the production claim (``FOR UPDATE SKIP LOCKED``) and, for
contrast, the lab's plain ``FOR UPDATE`` claim. Measured per round: jobs/s (first claim to last
finish), each claim's latency (timed in the worker), executions per job (``job_runs``: a
duplicate would show), the machine's CPU use (``/proc/stat``), and what the workers' server
sessions were doing, sampled from ``pg_stat_activity`` every few milliseconds: on the CPU,
waiting on a row lock (``RowLock``), on the server (``LWLock``, ``IO``) or on the worker process
(``Client``). Where the curve bends and why comes from those samples.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from .. import db, events, finding, queue
from ..finding import Result, Verdict, check, knob, plain
from ..queries import q
from ._claimers import ACTIVE
from ._procs import spawned

CLAIM = ("With FOR UPDATE SKIP LOCKED, 1, 2, 4 and 8 workers claim from one queue without "
         "waiting on each other's row locks and never run a job twice; a plain FOR UPDATE claim "
         "lines them up behind one row lock. How far jobs/s grows with the workers, and what "
         "stops it (the WAL flush at commit, the CPU, locks), is measured here, not claimed.")

ARTICLE: dict[str, Any] = {
    "note": "not in the article: it ran two workers; measured here beyond it",
}

CLAIMS = {"skip": "FOR UPDATE SKIP LOCKED", "plain": "plain FOR UPDATE"}
GAIN = 1.25  # the curve has bent where doubling the workers adds less than this factor


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """The jobs each round drains, the worker counts, and whether the contrast runs."""

    ARTICLE_SETUP: ClassVar[bool] = False  # the article never ran this: judged on expectations

    jobs: int = knob(400, full=5000, lo=200, hi=10000, step=100, label="no-op jobs per round")
    counts: tuple[int, ...] = knob((1, 2, 4, 8))
    plain: bool = knob(True, label="also the plain FOR UPDATE claim")


def cpu_times() -> tuple[float, float] | None:
    """Return the machine's (busy, total) CPU ticks from /proc/stat (None elsewhere)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


@contextmanager
def claimers(dsn: str, n: int, path: Path) -> Iterator[list[subprocess.Popen]]:
    """Start n claimer processes and wait until each listens; always end them."""
    argvs = [[sys.executable, "-m", "tenantlab.experiments._claimers", str(i), str(path)]
             for i in range(n)]
    with spawned(argvs, {"TENANTLAB_DSN": dsn}) as procs:
        deadline = time.monotonic() + 60
        while sum(e["event"] == "idle" for e in events.read(path)) < n:
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                raise RuntimeError("a claimer process did not start")
            time.sleep(0.05)
        yield procs


def one_round(s: db.Scratch, path: Path, n: int, workers: int, claim: str, jobs: int,
              interval: float = 0.01) -> dict[str, Any]:
    """Queue `jobs` no-op jobs, let `workers` processes drain them; return what was measured."""
    with s.connect("admin", "workers round", autocommit=True) as admin:
        admin.execute(q("reset_queue"))
        with s.connect("worker", "workers enqueue", autocommit=True) as conn:
            queue.enqueue(conn, "noop", count=jobs)
        admin.execute(q("analyze_jobs"))
        seen: Counter[str] = Counter()
        cpu0 = cpu_times()
        admin.execute(q("claimers_notify"), {"payload": f"go {n} {workers} {claim}"})
        deadline = time.monotonic() + 60 + jobs * 0.05
        samples = 0
        done: list[dict[str, Any]] = []
        while True:
            if samples % 10 == 0:  # the log holds every claim time: read it now and then
                done = [e for e in events.read(path)
                        if e["event"] == "round-done" and e["round"] == n]
                if len(done) >= workers:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"round {n} ({workers} workers, {claim}) still running")
            for what, sessions in admin.execute(q("worker_sessions"), {"like": ACTIVE}):
                seen[what] += sessions
            samples += 1
            time.sleep(interval)
        cpu1 = cpu_times()
        runs = admin.execute(q("run_counts")).fetchone()
        states: dict[str, int] = dict(admin.execute(q("job_counts")).fetchall())
    claim_ms = pd.Series([ms for e in done for ms in e["claim_ms"]], dtype=float)
    span = max(e["last"] for e in done) - min(e["first"] for e in done)
    total = sum(seen.values()) or 1
    busy = (cpu1[0] - cpu0[0]) / (cpu1[1] - cpu0[1]) if cpu0 and cpu1 and cpu1[1] > cpu0[1] \
        else None
    return {
        "claim": claim, "workers": workers, "jobs": jobs,
        "done": int(states.get("done", 0)), "runs": int(runs[0]) if runs else 0,
        "duplicates": int(runs[2]) if runs else 0,
        "jobs_per_s": round(jobs / span, 1) if span > 0 else 0.0,
        "claim_ms_p50": round(float(claim_ms.median()), 3),
        "claim_ms_p95": round(float(claim_ms.quantile(0.95)), 3),
        "claim_ms_max": round(float(claim_ms.max()), 3),
        # Shares of the workers' session time, from the samples.
        **{f"share_{k.lower()}": round(seen[k] / total, 3)
           for k in ("CPU", "RowLock", "Lock", "Client", "LWLock", "IO")},
        "lock_wait_s": round(seen["RowLock"] * span / max(samples, 1), 3),
        "machine_cpu_busy": round(busy, 3) if busy is not None else None,
        "worker_cpu_s": round(sum(e["cpu_s"] for e in done), 3),
        "seconds": round(span, 3),
    }


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Drain one queue with each worker count and claim; return per-round rows."""
    k = knobs or Knobs()
    if k.jobs < 1 or not k.counts or min(k.counts) < 1:
        raise ValueError("jobs and every worker count must be at least 1")
    claims = ("skip", "plain") if k.plain else ("skip",)
    rows: list[dict[str, Any]] = []
    with db.scratch("workers") as s, tempfile.TemporaryDirectory(prefix="tenantlab-") as tmp:
        path = Path(tmp) / "events.jsonl"
        with claimers(s.worker, max(k.counts), path) as procs:
            n = 0
            for claim in claims:
                for w in k.counts:
                    n += 1
                    rows.append(one_round(s, path, n, w, claim, k.jobs))
                    if live is not None:
                        live.update(pd.DataFrame(rows))
                    if progress:
                        progress(1)
            with s.connect("admin", "workers stop", autocommit=True) as admin:
                admin.execute(q("claimers_notify"), {"payload": "stop"})
            for p in procs:
                p.wait(timeout=30)
    table = pd.DataFrame(rows)
    measured = plain(_measured(table, k))
    return Result("workers", k, measured, judge(measured, k), summary=_summary(measured),
                  table=table)


def bend(rates: dict[str, float]) -> int | None:
    """Return the worker count after which doubling adds less than GAIN (None: it never bends)."""
    counts = sorted(rates, key=int)
    for a, b in zip(counts, counts[1:], strict=False):
        if rates[b] < GAIN * rates[a]:
            return int(a)
    return None


def _measured(table: pd.DataFrame, k: Knobs) -> dict[str, Any]:
    def by_count(df: pd.DataFrame, col: str) -> dict[str, Any]:
        return {str(r.workers): getattr(r, col) for r in df.itertuples()}

    skip = table[table["claim"] == "skip"]
    out: dict[str, Any] = {
        "jobs_per_s": by_count(skip, "jobs_per_s"),
        "duplicates": int(table["duplicates"].sum()),
        "jobs": k.jobs,
        "done": by_count(skip, "done"),
        "claim_ms_p50": by_count(skip, "claim_ms_p50"),
        "claim_ms_p95": by_count(skip, "claim_ms_p95"),
        "lock_wait_share": by_count(skip, "share_rowlock"),
        "io_share": by_count(skip, "share_io"),
        "lwlock_share": by_count(skip, "share_lwlock"),
        "cpu_share": by_count(skip, "share_cpu"),
        "client_share": by_count(skip, "share_client"),
        "machine_cpu_busy": by_count(skip, "machine_cpu_busy"),
        "cores": os.cpu_count(),
    }
    out["bends_after"] = bend(out["jobs_per_s"])
    p = table[table["claim"] == "plain"]
    if len(p):
        out["plain_for_update"] = {
            "jobs_per_s": by_count(p, "jobs_per_s"), "claim_ms_p95": by_count(p, "claim_ms_p95"),
            "lock_wait_share": by_count(p, "share_rowlock"), "lock_wait_s": by_count(p, "lock_wait_s"),
            "done": by_count(p, "done"), "duplicates": int(p["duplicates"].sum()),
        }
    return out


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """No duplicates; SKIP LOCKED never waits on a row lock; plain FOR UPDATE queues on one.

    Throughput is measured, never judged: where it stops growing depends on the machine and on
    what else runs on it (the summary and the notebook's bars say where, and why).
    """
    rates, done, jobs = measured["jobs_per_s"], measured["done"], measured["jobs"]
    waits = measured["lock_wait_share"]
    top = max(rates, key=int)
    checks = [
        check("every job ran, none twice",
              measured["duplicates"] == 0 and all(d == jobs for d in done.values()),
              f"{jobs:,} of {jobs:,} each round, 0 twice",
              f"{min(done.values()):,} of {jobs:,} at worst, {measured['duplicates']} twice"),
        check("SKIP LOCKED: no row-lock waits", max(waits.values()) < 0.02,
              "under 2% of the workers' session time, at every count",
              ", ".join(f"{w}: {s:.1%}" for w, s in waits.items())),
    ]
    if p := measured.get("plain_for_update"):
        checks.append(check(
            "plain FOR UPDATE: a lock queue",
            p["lock_wait_share"][top] > max(0.01, waits[top]),
            f"the workers wait on a row lock at {top} workers",
            f"{p['lock_wait_share'][top]:.0%} of session time on row locks at {top} workers "
            f"(SKIP LOCKED {waits[top]:.0%}); claim p95 {p['claim_ms_p95'][top]:.3g} ms vs "
            f"{measured['claim_ms_p95'][top]:.3g} ms; {p['jobs_per_s'][top]:g} jobs/s vs "
            f"{rates[top]:g}"))
    return Verdict.of(checks, article=False)


def _summary(m: dict[str, Any]) -> str:
    text = ("SKIP LOCKED jobs/s " + ", ".join(f"{w}: {r:g}" for w, r in m["jobs_per_s"].items())
            + (f" (bends after {m['bends_after']}" if m["bends_after"] else " (still growing")
            + f", {m['cores']} cores); claim p95 ms "
            + ", ".join(f"{w}: {v:.3g}" for w, v in m["claim_ms_p95"].items())
            + f"; duplicates {m['duplicates']}")
    if p := m.get("plain_for_update"):
        text += ("; plain FOR UPDATE lock-wait share " + ", ".join(
            f"{w}: {s:.0%}" for w, s in p["lock_wait_share"].items()))
    return text
