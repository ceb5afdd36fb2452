"""Finding ``workers`` (beyond the article): 1, 2, 4, 8 worker processes on one queue.

Eight worker processes (``_claimers.py``) start once; each round, the first W of them drain the
same queue of no-op jobs, with the production claim (``FOR UPDATE SKIP LOCKED``) and, for
contrast, the lab's plain ``FOR UPDATE`` claim. Measured per round: jobs/s (first claim to last
finish), each claim's latency (timed in the worker), executions per job (``job_runs``: a
duplicate would show), the machine's CPU use (``/proc/stat``), and what the workers' server
sessions were doing, sampled from ``pg_stat_activity`` every few milliseconds: on the CPU,
waiting on a row lock (``RowLock``), on the server (``LWLock``, ``IO``) or on the worker process
(``Client``). Where the curve bends and why comes from those samples. A session waiting on a
row lock is named with the statement it runs (a claim, or the fenced finish) and the statement
of the session holding the lock (``pg_blocking_pids``): with SKIP LOCKED no claim waits; the
waits left are finishes on a claim's *re-check lock*. A claim whose snapshot was taken before
another worker claimed and committed a job still sees that job queued: it locks the job's newest
version to re-check it, finds it taken, skips it, and keeps that lock until its own claim
commits; the job's finish waits for it. A last step shows that lock on two connections, the
claim held after its snapshot until the other claim committed, and the claim started after that
commit (no wait).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from .. import db, events, finding, queue
from ..finding import Result, Verdict, check, knob, plain
from ..queries import q
from ._claimers import ACTIVE
from ._procs import spawned

CLAIM = ("With FOR UPDATE SKIP LOCKED, 1, 2, 4 and 8 workers claim from one queue, never run "
         "a job twice, and no claim waits on another claim; the row-lock waits left are a "
         "finish waiting on a claim that re-checked its job (a claim whose snapshot predates "
         "that job's claim locks it to re-check it and keeps the lock until it commits), far "
         "fewer than with a plain FOR UPDATE claim, which lines the claims up behind one row "
         "lock. How far jobs/s grows with the workers, and what stops it (the WAL flush at "
         "commit, the CPU, locks), is measured here, not claimed.")

ARTICLE: dict[str, Any] = {
    "note": "not in the article: it ran two workers; measured here beyond it",
}

CLAIMS = {"skip": "FOR UPDATE SKIP LOCKED", "plain": "plain FOR UPDATE"}
GAIN = 1.25  # the curve has bent where doubling the workers adds less than this factor
#: SKIP LOCKED's row-lock waits are at most this share of plain FOR UPDATE's at the top count.
BELOW = 1 / 3
#: Who waits on whom, as the sampler names it: ``waiter on blocker``.
PAIRS = ("finish on claim", "claim on claim", "other")
RECHECK_KEY = 0x7E4A4C  # the advisory lock the re-check demonstration's claim waits for


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """The jobs each round drains, the worker counts, and whether the contrast runs."""

    ARTICLE_SETUP: ClassVar[bool] = False  # the article never ran this: judged on expectations

    jobs: int = knob(400, full=5000, at_least=1, lo=200, hi=10000, step=100, label="no-op jobs per round")
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
    """Queue `jobs` no-op jobs, let `workers` processes drain them; return what was measured.

    A plain FOR UPDATE round with two workers or more starts with its first job held (as a claim
    holds it) until a sample has seen a claim waiting on it: the claims line up however fast the
    drain, and the round's other waits are as they come (the hold adds a few samples to its span).
    """
    with s.connect("admin", "workers round", autocommit=True) as admin, ExitStack() as stack:
        admin.execute(q("reset_queue"))
        with s.connect("worker", "workers enqueue", autocommit=True) as conn:
            queue.enqueue(conn, "noop", count=jobs)
        admin.execute(q("analyze_jobs"))
        seen: Counter[str] = Counter()
        pairs: Counter[str] = Counter()
        holder = None
        if claim == "plain" and workers > 1:
            holder = stack.enter_context(s.connect("worker", "workers hold"))
            holder.execute(q("hold_first_claimable"), {"kinds": ["noop"]})
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
            for what, waiter, blocker, sessions in admin.execute(q("worker_sessions"),
                                                                 {"like": ACTIVE}):
                seen[what] += sessions
                if what == "RowLock":
                    pairs[f"{waiter} on {blocker}"] += sessions
            if holder is not None and any(raw.startswith("claim ") for raw in pairs):
                holder.commit()  # a claim was seen queuing on the held job: let the round run
                holder = None
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
        # The row-lock waits by who waits on whom, as shares of the session time.
        **{f"share_{p.replace(' ', '_')}": round(sum(n for raw, n in pairs.items()
                                                     if pair(raw) == p) / total, 4)
           for p in PAIRS},
        "claim_waits": sum(n for raw, n in pairs.items() if raw.startswith("claim ")),
        "wait_pairs": dict(pairs),
        "lock_wait_s": round(seen["RowLock"] * span / max(samples, 1), 3),
        "machine_cpu_busy": round(busy, 3) if busy is not None else None,
        "worker_cpu_s": round(sum(e["cpu_s"] for e in done), 3),
        "seconds": round(span, 3),
    }


def pair(raw: str) -> str:
    """Return a sampled ``waiter on blocker`` as one of PAIRS."""
    return raw if raw in PAIRS else "other"


def recheck_lock(s: db.Scratch) -> dict[str, Any]:
    """Show the re-check lock on two connections; return who waited on whom.

    B's claim (``claim_skip_held``) takes its snapshot, then waits for an advisory lock the
    experiment holds; meanwhile A claims job 1 and commits. Released, B's claim re-checks job 1,
    skips it, claims job 2 and stays uncommitted: A's finish of job 1 waits on B. The control:
    B's claim starts after A's commit, so job 1 is not claimable in its snapshot and A's finish
    does not wait. The lock, not a sleep, orders the steps: a busy machine cannot reorder them.
    """
    return {"recheck": _recheck_case(s, held=True), "control": _recheck_case(s, held=False)}


def _recheck_case(s: db.Scratch, *, held: bool) -> dict[str, Any]:
    """Run A's claim while B's claim waits after its snapshot (`held`), or before it; then A's
    finish, watched from admin."""
    key = {"key": RECHECK_KEY}
    with s.connect("admin", "recheck", autocommit=True) as admin:
        admin.execute(q("reset_queue"))
        with s.connect("worker", "recheck enqueue", autocommit=True) as conn:
            queue.enqueue(conn, "noop", count=3)
        design = queue.Leased(backoff=0)
        with s.connect("worker", "recheck A", autocommit=True) as a, \
                s.connect("worker", "recheck B") as b:
            b_pid = b.info.backend_pid
            got: dict[str, Any] = {}

            def b_claims() -> None:
                got["rows"] = b.execute(q("claim_skip_held"),
                                        {"lease": 30, "kinds": ["noop"], **key}).fetchall()

            claiming = threading.Thread(target=b_claims)
            if held:
                admin.execute(q("recheck_hold"), key)
                try:
                    claiming.start()
                    _until_waiting(admin, b_pid)  # B's snapshot is taken: it waits for the lock
                    claim = design.claim(a, worker="A")
                finally:
                    admin.execute(q("recheck_release"), key)
            else:
                claim = design.claim(a, worker="A")
                claiming.start()
            claiming.join()
            if claim is None:
                raise RuntimeError("the re-check demonstration: A claimed nothing")
            # A's finish in a thread of its own; admin looks whether it waits, and on whom.
            a.execute(q("lock_timeout"), {"timeout": "10s"})
            done: dict[str, Any] = {}

            def a_finishes() -> None:
                done["status"] = design.execute(a, claim).status

            finish = threading.Thread(target=a_finishes)
            finish.start()
            seen: tuple[Any, ...] | None = None
            deadline = time.monotonic() + 2.0
            while finish.is_alive() and time.monotonic() < deadline:
                row = admin.execute(q("lock_wait_of"), {"pid": a.info.backend_pid}).fetchone()
                if row and row[0]:
                    seen = tuple(row)
                    break
                time.sleep(0.02)
            b.commit()  # B's claim commits: its lock on job 1 goes
            finish.join()
    return {"a_claimed": claim.id, "b_claimed": [r[0] for r in got.get("rows", [])],
            "finish_waited": seen is not None, "wait_event": seen[1] if seen else None,
            "blocked_by_b": seen is not None and b_pid in (seen[2] or []),
            "finish": done.get("status")}


def _until_waiting(admin: Any, pid: int, timeout: float = 30.0) -> None:
    """Return once backend `pid` waits on a lock."""
    deadline = time.monotonic() + timeout
    while not (admin.execute(q("lock_wait_of"), {"pid": pid}).fetchone() or [False])[0]:
        if time.monotonic() > deadline:
            raise TimeoutError("the re-check demonstration: B's claim never waited")
        time.sleep(0.01)


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Drain one queue with each worker count and claim; return per-round rows."""
    k = knobs or Knobs.sized()
    if not k.counts or min(k.counts) < 1:
        raise finding.KnobError("every worker count must be at least 1")
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
        recheck = recheck_lock(s)
    table = pd.DataFrame(rows)
    measured = plain({**_measured(table, k), "recheck_lock": recheck})
    return Result("workers", k, measured, judge(measured, k),
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

    def by_kind(df: pd.DataFrame) -> dict[str, dict[str, float]]:
        return {str(r["workers"]): {p: r[f"share_{p.replace(' ', '_')}"] for p in PAIRS}
                for r in df.to_dict("records")}

    skip = table[table["claim"] == "skip"]
    out: dict[str, Any] = {
        "jobs_per_s": by_count(skip, "jobs_per_s"),
        "duplicates": int(table["duplicates"].sum()),
        "jobs": k.jobs,
        "done": by_count(skip, "done"),
        "claim_ms_p50": by_count(skip, "claim_ms_p50"),
        "claim_ms_p95": by_count(skip, "claim_ms_p95"),
        "lock_wait_share": by_count(skip, "share_rowlock"),
        "lock_waits_by_kind": by_kind(skip),
        "claim_waits": by_count(skip, "claim_waits"),
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
            "lock_waits_by_kind": by_kind(p), "claim_waits": by_count(p, "claim_waits"),
            "done": by_count(p, "done"), "duplicates": int(p["duplicates"].sum()),
        }
    return out


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """No duplicates; no SKIP LOCKED claim waits; the re-check lock; plain FOR UPDATE queues.

    Throughput is measured, never judged: where it stops growing depends on the machine and on
    what else runs on it (the summary and the notebook's bars say where, and why).
    """
    rates, done, jobs = measured["jobs_per_s"], measured["done"], measured["jobs"]
    waits = measured["lock_wait_share"]
    kinds = measured.get("lock_waits_by_kind", {})
    claim_waits = measured.get("claim_waits", {})
    top = max(rates, key=int)
    checks = [
        check("every job ran, none twice",
              measured["duplicates"] == 0 and all(d == jobs for d in done.values()),
              f"{jobs:,} of {jobs:,} each round, 0 twice",
              f"{min(done.values()):,} of {jobs:,} at worst, {measured['duplicates']} twice"),
    ]
    if claim_waits:
        checks.append(check(
            "SKIP LOCKED: no claim waits on another claim",
            not any(claim_waits.values()),
            "no claim seen waiting, at any count; the row-lock waits seen are finishes "
            "waiting on a claim's re-check lock",
            f"claims seen waiting: {sum(claim_waits.values())}; row-lock waits (share of "
            "session time): " + ", ".join(f"{w}: {waits[w]:.1%}" + _kinds(kinds.get(w, {}))
                                          for w in waits)))
    if r := measured.get("recheck_lock"):
        rc, ctl = r["recheck"], r["control"]
        ok = (rc["finish_waited"] and rc["blocked_by_b"] and rc["finish"] == "done"
              and 1 not in rc["b_claimed"] and not ctl["finish_waited"])
        checks.append(check(
            "the re-check lock", ok,
            "B's claim, its snapshot taken before A claimed job 1, skips job 1 but keeps its "
            "lock: A's finish waits on B until B commits; B's claim started after A's commit: "
            "no wait",
            f"A's finish {'waited on B' if rc['blocked_by_b'] else 'did not wait on B'} "
            f"({rc['wait_event'] or 'no wait'}), B claimed job {_ids(rc['b_claimed'])}, then "
            f"A's finish: {rc['finish']}; control: "
            f"{'waited' if ctl['finish_waited'] else 'no wait'}, {ctl['finish']}"))
    if p := measured.get("plain_for_update"):
        plain_waits = p["lock_wait_share"][top]
        checks.append(check(
            "SKIP LOCKED waits far below plain FOR UPDATE's",
            plain_waits > 0 and waits[top] <= BELOW * plain_waits,
            f"at most {BELOW:.0%} of plain FOR UPDATE's row-lock waits at {top} workers",
            f"{waits[top]:.1%} vs {plain_waits:.1%} of session time at {top} workers; "
            "plain FOR UPDATE " + ", ".join(f"{w}: {s:.0%}" for w, s in
                                            p["lock_wait_share"].items()), timing=True))
        plain_claims = p.get("claim_waits", {}).get(top)
        if plain_claims is not None:
            checks.append(check(
                "plain FOR UPDATE: claims queue on claims", plain_claims > 0,
                f"claims seen waiting on a claim's row lock at {top} workers",
                f"{plain_claims} claim waits seen at {top} workers"
                + _kinds(p.get("lock_waits_by_kind", {}).get(top, {}))
                + f"; claim p95 {p['claim_ms_p95'][top]:.3g} ms vs "
                f"{measured['claim_ms_p95'][top]:.3g} ms; {p['jobs_per_s'][top]:g} jobs/s vs "
                f"{rates[top]:g}"))
        else:  # a stored run from before the sampler named the statements
            checks.append(check(
                "plain FOR UPDATE: a lock queue", plain_waits > max(0.01, waits[top]),
                f"the workers wait on a row lock at {top} workers",
                f"{plain_waits:.0%} of session time on row locks at {top} workers "
                f"(SKIP LOCKED {waits[top]:.0%})", timing=True))
    return Verdict.of(checks, article=False)


def _kinds(shares: dict[str, float]) -> str:
    seen = [f"{name} {share:.1%}" for name, share in shares.items() if share]
    return f" ({', '.join(seen)})" if seen else ""


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids)) or "none"
