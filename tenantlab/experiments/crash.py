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

from dataclasses import dataclass
from typing import Any

import pandas as pd
from jobqueue import Reaper, ReaperConfig

from .. import finding, queue
from ..finding import Result, Verdict, check, knob
from ..queries import q
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


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """Crash workers of each design; the article's experiment is already this small."""

    max_attempts: int = knob(3, lo=1, hi=5, label="crashes allowed (max attempts)")
    lease: float = knob(1.0, lo=0.5, hi=3.0, step=0.1, label="lease (s)")
    restart_after: float = knob(1.1, lo=0.0, hi=3.0, step=0.1, label="restart after (s)")
    single_workers: int = knob(4, lo=1, hi=6, label="single workers")
    work_seconds: float = knob(0.2)
    designs: tuple[str, ...] = knob(("single", "leased"))


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
    crashes, visible_after_crash, looks = 0, [], []
    with run.scratch.connect("worker", "crash watch", autocommit=True) as conn:
        for i in range(1, max_attempts + 3):
            proc = run.start(design="leased", name=f"leased-{i}", lease=lease, until_empty=True,
                             poll=0.05)
            code = run.wait(proc)
            # Eligible first, the lease after: a lease still held at the second look was held at
            # the first, so a slow machine cannot pass off an expired lease as a held one.
            eligible = [r[0] for r in conn.execute(q("eligible_leased"))]
            job = queue.job_states(conn)[CRASH - 1]
            rows.append({"design": "leased", "worker": f"leased-{i}", "exit_code": code,
                         "crashed": code != 0, "status_after": job["status"],
                         "attempts_after": job["attempts"]})
            if code == 0:
                break
            crashes += 1
            # Right after the crash: can the claim see the job? (Not until the lease expires.)
            visible_after_crash.append(CRASH in eligible)
            looks.append({"visible": CRASH in eligible, "lease_held": not job["lease_expired"]})
            run.sleep(restart_after)
        before = {s["id"]: s for s in queue.job_states(conn)}
        # No grace: the lab shows the reaper's decision right after the lease (its default
        # waits 30 s past it, for a worker that is late but alive).
        reaped = Reaper(conn, ReaperConfig(grace=0), events=run.log("reaper")).run_once()
        after = queue.job_states(conn)[CRASH - 1]
    run.tick()
    crash = before[CRASH]
    return {"crashes": crashes, "status_before_reap": crash["status"],
            "attempts": crash["attempts"], "lease_expired": bool(crash["lease_expired"]),
            "next_job_ran": before[NEXT]["status"] == "done",
            "visible_right_after_crash": any(visible_after_crash),
            # Looks whose lease still held (a slow machine may look only after it expired).
            "looks_while_lease_held": sum(lk["lease_held"] for lk in looks),
            "visible_while_lease_held": any(lk["visible"] and lk["lease_held"] for lk in looks),
            "reaped": [r["id"] for r in reaped], "status_after_reap": after["status"]}


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Crash workers of each design against one crash job; return one table row per worker.

    ``single_workers``: how many single-transaction workers to start (each dies);
    ``restart_after``: seconds between a leased crash and the next worker (must exceed the
    lease for the job to be claimable again).
    """
    k = knobs or Knobs.sized()
    if not 1 <= k.max_attempts <= 10 or not 1 <= k.single_workers <= 20:
        raise ValueError("max_attempts must be 1..10 and single_workers 1..20")
    if not k.lease > 0 or k.restart_after < 0:
        raise ValueError("lease must be positive and restart_after at least 0 seconds")
    unknown = [d for d in k.designs if d not in ("single", "leased")]
    if unknown:
        raise ValueError(f"unknown design {unknown[0]!r}; valid: single, leased")
    rows: list[dict[str, Any]] = []
    measured: dict[str, Any] = {}
    with workers_run("crash", live) as r:
        if "single" in k.designs:
            measured["single"] = run_single(r, workers=k.single_workers,
                                            max_attempts=k.max_attempts,
                                            work_seconds=k.work_seconds, rows=rows)
            if progress:
                progress(1)
        if "leased" in k.designs:
            measured["leased"] = run_leased(r, max_attempts=k.max_attempts, lease=k.lease,
                                            restart_after=k.restart_after,
                                            work_seconds=k.work_seconds, rows=rows)
            if progress:
                progress(1)
        ev = r.events()
    return Result("crash", k, measured, judge(measured, k),
                  table=pd.DataFrame(rows), events=ev)


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Judge each design that ran: single dies every time; leased stops at max, reaper marks dead.

    A restart within the lease (``restart_after`` not longer than ``lease``, never the
    article's setup) may find the job still invisible: then fewer crashes than max attempts
    are expected, and the reaper leaves a job alone while it has attempts or a live lease.
    """
    k = knobs or Knobs()
    checks = []
    if s := measured.get("single"):
        checks += [
            check("single: every worker died", s["crashes"] == s["workers"],
                  f"{s['workers']} of {s['workers']}", f"{s['crashes']} of {s['workers']}"),
            check("single: the job after each crash", s["status"] == "queued"
                  and s["attempts"] == 0, "queued, attempts 0",
                  f"{s['status']}, attempts {s['attempts']}"),
            check("single: the job behind it", not s["next_job_ran"], "never ran",
                  _ran(s["next_job_ran"])),
        ]
    if lz := measured.get("leased"):
        most = k.max_attempts
        # Restarted after the lease: every next worker claims it again, until max attempts.
        reclaims = k.restart_after > k.lease
        crashes_ok = lz["crashes"] == most if reclaims else 1 <= lz["crashes"] <= most
        final = "dead" if reclaims or (lz["lease_expired"] and lz["attempts"] >= most) \
            else "running"
        left_ok = lz["status_before_reap"] == "running" and (lz["lease_expired"] or not reclaims)
        checks += [
            check("leased: crashes before it stops",
                  crashes_ok and lz["attempts"] == lz["crashes"],
                  f"{most if reclaims else f'1 to {most}'}, each counted",
                  f"{lz['crashes']}, attempts {lz['attempts']}"),
            _invisible_check(lz),
            check("leased: the job behind it", lz["next_job_ran"], "ran",
                  _ran(lz["next_job_ran"])),
            check("leased: left behind", left_ok,
                  "running, lease expired" if reclaims else "running",
                  f"{lz['status_before_reap']}, lease "
                  f"{'expired' if lz['lease_expired'] else 'held'}"),
            check("leased: after the reaper", lz["status_after_reap"] == final, final,
                  lz["status_after_reap"]),
        ]
    return Verdict.of(checks, article=k.is_article_setup())


def _invisible_check(lz: dict[str, Any]) -> finding.Check:
    """Return whether a crashed job stayed invisible while its lease held.

    Judged on the looks whose lease still held after the look: on a slow machine a look may
    come after the lease ran out, and a job visible then is as it should be.
    """
    if "visible_while_lease_held" not in lz:  # a stored run from before the lease was read
        visible = lz["visible_right_after_crash"]
        return check("leased: right after a crash", not visible, "invisible (lease held)",
                     "visible" if visible else "invisible (lease held)")
    visible, held = lz["visible_while_lease_held"], lz["looks_while_lease_held"]
    return check("leased: right after a crash", not visible, "invisible while the lease holds",
                 f"{'visible' if visible else 'invisible'}; {held} of {lz['crashes']} looks "
                 "while the lease held")


def _ran(ran: bool) -> str:
    return "ran" if ran else "never ran"
