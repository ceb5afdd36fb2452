"""Finding ``crash``: a worker process dies mid-job (``os._exit(1)``), a new one starts after it.

A crash job with a normal job behind it; fresh worker processes, each started after the
previous one died. Single transaction: PostgreSQL rolls the dead worker's transaction back,
the job is ``queued`` with attempts 0 again, and every next worker picks it and dies. Leased
(lease 1 s, next worker 1.1 s later): the attempt was committed at the claim, the job is
invisible until its lease expires, and after max_attempts crashes it is no longer eligible and
the queue moves on; but it stays ``running`` with an expired lease until the reaper marks it
dead.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pandas as pd

from .. import queue
from ..queries import q
from ..reaper import Reaper
from ._workers import WorkersRun, workers_run

CLAIM = ("A job that kills the worker process kills every next worker in the single-transaction "
         "queue (queued, attempts 0 each time); the leased queue counts it at the claim, stops "
         "after 3 crashes and moves on, but leaves it running with an expired lease until a "
         "reaper marks it dead.")

ARTICLE: dict[str, Any] = {
    "single": {"status": "queued", "attempts": 0, "every_worker_died": True},
    "leased": {"crashes": 3, "status_before_reap": "running", "attempts": 3,
               "lease_expired": True, "next_job_ran": True,
               "status_after_reap": "dead (proposed; the article did not run the reaper)"},
    "setup": "os._exit(1) mid-job; leased: lease 1 s, next worker started 1.1 s after a crash",
}

CRASH, NEXT = 1, 2  # job ids after reset_queue


class Result(NamedTuple):
    table: pd.DataFrame  # one row per worker process started
    summary: dict[str, Any]
    events: pd.DataFrame


def _queue(run: WorkersRun, max_attempts: int, work_seconds: float) -> None:
    with run.scratch.connect("admin", "crash reset", autocommit=True) as admin:
        admin.execute(q("reset_queue"))
    with run.scratch.connect("worker", "crash enqueue", autocommit=True) as conn:
        queue.enqueue(conn, "crash", tenant=1, seconds=work_seconds, max_attempts=max_attempts)
        queue.enqueue(conn, "count", tenant=2, max_attempts=max_attempts)


def run_single(run: WorkersRun, *, workers: int, max_attempts: int, work_seconds: float,
               rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Start `workers` single-transaction workers one after the other, each after the last died."""
    _queue(run, max_attempts, work_seconds)
    crashes = 0
    with run.scratch.connect("worker", "crash watch", autocommit=True) as conn:
        for i in range(1, workers + 1):
            proc = run.start(design="single", name=f"single-{i}", until_empty=True, poll=0.05)
            code = run.wait(proc)
            crashes += code != 0
            job = queue.job_states(conn)[CRASH - 1]
            rows.append({"design": "single", "worker": f"single-{i}", "exit_code": code,
                         "crashed": code != 0, "status_after": job["status"],
                         "attempts_after": job["attempts"]})
        states = {s["id"]: s for s in queue.job_states(conn)}
    return {"workers": workers, "crashes": crashes, "status": states[CRASH]["status"],
            "attempts": states[CRASH]["attempts"],
            "next_job_ran": states[NEXT]["status"] == "done"}


def run_leased(run: WorkersRun, *, max_attempts: int, lease: float, restart_after: float,
               work_seconds: float, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Start leased workers until one survives; then look at the crash job and reap it."""
    _queue(run, max_attempts, work_seconds)
    crashes, visible_after_crash = 0, []
    with run.scratch.connect("worker", "crash watch", autocommit=True) as conn:
        for i in range(1, max_attempts + 3):
            proc = run.start(design="leased", name=f"leased-{i}", lease=lease, until_empty=True,
                             poll=0.05)
            code = run.wait(proc)
            job = queue.job_states(conn)[CRASH - 1]
            eligible = [r[0] for r in conn.execute(q("eligible_leased"))]
            rows.append({"design": "leased", "worker": f"leased-{i}", "exit_code": code,
                         "crashed": code != 0, "status_after": job["status"],
                         "attempts_after": job["attempts"]})
            if code == 0:
                break
            crashes += 1
            # Right after the crash: can the claim see the job? (Not until the lease expires.)
            visible_after_crash.append(CRASH in eligible)
            run.sleep(restart_after)
        before = {s["id"]: s for s in queue.job_states(conn)}
        reaped = Reaper(conn, events=run.log("reaper")).run_once()
        after = queue.job_states(conn)[CRASH - 1]
    run.tick()
    crash = before[CRASH]
    return {"crashes": crashes, "status_before_reap": crash["status"],
            "attempts": crash["attempts"], "lease_expired": bool(crash["lease_expired"]),
            "next_job_ran": before[NEXT]["status"] == "done",
            "visible_right_after_crash": any(visible_after_crash),
            "reaped": [r["id"] for r in reaped], "status_after_reap": after["status"],
            "lease": lease, "restart_after": restart_after, "max_attempts": max_attempts}


def run(*, full: bool = False, progress: Any = None, live: Any = None, max_attempts: int = 3,
        single_workers: int = 4, lease: float = 1.0, restart_after: float = 1.1,
        work_seconds: float = 0.2, designs: tuple[str, ...] = ("single", "leased")) -> Result:
    """Crash workers of each design against one crash job; return one row per worker.

    ``single_workers``: how many single-transaction workers to start (each dies);
    ``restart_after``: seconds between a leased crash and the next worker (must exceed the
    lease for the job to be claimable again). ``full`` changes nothing.
    """
    if not 1 <= max_attempts <= 10 or not 1 <= single_workers <= 20:
        raise ValueError("max_attempts must be 1..10 and single_workers 1..20")
    if not lease > 0 or restart_after < 0:
        raise ValueError("lease must be positive and restart_after at least 0 seconds")
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    with workers_run("crash", live) as r:
        if "single" in designs:
            summary["single"] = run_single(r, workers=single_workers, max_attempts=max_attempts,
                                           work_seconds=work_seconds, rows=rows)
            if progress:
                progress(1)
        if "leased" in designs:
            summary["leased"] = run_leased(r, max_attempts=max_attempts, lease=lease,
                                           restart_after=restart_after,
                                           work_seconds=work_seconds, rows=rows)
            if progress:
                progress(1)
        ev = r.events()
    return Result(pd.DataFrame(rows), summary, ev)


def check(summary: dict[str, Any]) -> dict[str, bool]:
    """Return, per design run, whether it behaved as the article says."""
    out = {}
    if s := summary.get("single"):
        out["single"] = (s["crashes"] == s["workers"] and s["status"] == "queued"
                         and s["attempts"] == 0 and not s["next_job_ran"])
    if lz := summary.get("leased"):
        out["leased"] = (lz["crashes"] == lz["max_attempts"] and lz["attempts"] == lz["crashes"]
                         and lz["status_before_reap"] == "running" and lz["lease_expired"]
                         and not lz["visible_right_after_crash"]
                         and lz["next_job_ran"] and lz["status_after_reap"] == "dead")
    return out


def verdict(summary: dict[str, Any]) -> tuple[bool, str, str]:
    """Return (agrees, expected, measured) for nb.verdict."""
    parts = []
    if s := summary.get("single"):
        parts.append(f"single: {s['crashes']} of {s['workers']} workers died, job "
                     f"{s['status']} with attempts {s['attempts']}, next job ran "
                     f"{s['next_job_ran']}")
    if lz := summary.get("leased"):
        parts.append(f"leased: {lz['crashes']} crashes, then {lz['status_before_reap']} with "
                     f"attempts {lz['attempts']} (lease expired {lz['lease_expired']}), next job "
                     f"ran {lz['next_job_ran']}, after the reaper {lz['status_after_reap']}")
    expected = ("single: every worker dies, queued, attempts 0; leased: 3 crashes, then running "
                "with an expired lease, queue moves on, dead after the reaper")
    return all(check(summary).values()), expected, "; ".join(parts)


def reproduce(full: bool = False) -> dict[str, Any]:
    """Run both designs with the article's lease (1 s) and restart delay (1.1 s)."""
    res = run(full=full)
    s, lz = res.summary["single"], res.summary["leased"]
    measured = {
        "single": {"crashes": s["crashes"], "status": s["status"], "attempts": s["attempts"],
                   "workers": s["workers"], "next_job_ran": s["next_job_ran"]},
        "leased": {k: lz[k] for k in ("crashes", "status_before_reap", "attempts",
                                      "next_job_ran", "status_after_reap", "lease_expired",
                                      "visible_right_after_crash")},
    }
    ok, _, text = verdict(res.summary)
    return {"measured": measured, "reproduced": ok, "summary": text}
