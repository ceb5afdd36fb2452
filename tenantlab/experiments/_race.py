"""Two leased workers race for one job (finding ``overrun``): start, queue, settle, count.

Worker A and worker B poll an empty queue; one ``outside`` job is queued, worker A claims it,
and the run waits until the job is settled. What is counted: the executions the outside world
saw (a file no transaction can roll back), the ``job_runs`` rows that finished, and what the
workers' event log says (claims, heartbeats, fences, the maximum runtime).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .. import events as event_log
from .. import outside, queue
from ..errors import TenantlabError
from ..queries import q
from ._gantt import overlap_seconds, segments
from ._workers import WorkersRun

WORKERS = ("worker A", "worker B")  # as in the notebook's script: A claims first


class OverrunError(TenantlabError, RuntimeError):
    """The overrun experiment could not run as set up."""


def race(run: WorkersRun, options: dict[str, Any], *, job: float, hang: float, timeout: float,
         live: Any = None) -> dict[str, Any]:
    """Start two workers, queue one job once both poll, wait until it is settled; return facts.

    ``options``: the worker command's; ``job``: seconds the job works; ``hang``: seconds the
    first attempt's outside call hangs (0: not stuck). ``live.update(segments)`` is called every
    0.2 s while the job runs, and once at the end; ``facts["segments"]`` holds the last rows.
    """
    outside_file = run.path.with_name("outside.jsonl")
    run.fleet.env[outside.FILE_ENV] = str(outside_file)
    run.fleet.env[outside.HANG_ENV] = str(hang)
    procs = {name: run.start(name=name, **options) for name in WORKERS}
    first, second = WORKERS

    def logged() -> list[dict[str, Any]]:
        return event_log.read(run.path)

    def polling() -> bool:
        for name, p in procs.items():
            if p.poll() is not None:
                raise OverrunError(f"{name} exited ({p.returncode}) before the job was queued")
        return {e["worker"] for e in logged() if e["event"] == "idle"} >= set(WORKERS)

    run.until(polling, timeout=30)
    t0 = time.time()

    def draw() -> None:
        if live is not None:
            live.update(segments(logged(), t0=t0, now=time.time()))

    def claimed_by_first() -> bool:
        draw()
        return procs[first].poll() is not None or any(
            e["event"] == "claim" and e["worker"] == first for e in logged())

    with run.scratch.connect("worker", "overrun enqueue", autocommit=True) as conn:
        with _held_back(procs[second]):
            t0 = time.time()
            (job_id,) = queue.enqueue(conn, "outside", tenant=1, seconds=job)
            run.until(claimed_by_first, timeout=30)

        def settled() -> bool:
            draw()
            claimed = {e["worker"] for e in logged() if e["event"] == "claim"}
            running = [n for n in claimed if procs[n].poll() is None]
            if all(p.poll() is not None for p in procs.values()):
                return True
            status = next(x["status"] for x in queue.job_states(conn) if x["id"] == job_id)
            return status in ("done", "dead") and not running

        run.until(settled, timeout=timeout)
    draw()
    return {**_facts(run, job_id, outside_file),
            "segments": segments(logged(), t0=t0, now=time.time())}


@contextmanager
def _held_back(proc: subprocess.Popen) -> Iterator[None]:
    """Pause a polling worker (SIGSTOP) for a moment, and let it go on however the block ends.

    The article's script has worker A claim while worker B polls: both poll every 100 ms, so
    without this either could claim first. B misses the polls until A's claim, no more (the
    queue was empty: B holds nothing the claim needs).
    """
    stop = getattr(signal, "SIGSTOP", None)
    if stop is None or proc.poll() is not None:  # no SIGSTOP (Windows): whoever polls first
        yield
        return
    os.kill(proc.pid, stop)
    try:
        yield
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)


def _facts(run: WorkersRun, job: int, outside_file: Any) -> dict[str, Any]:
    calls = [c for c in outside.read(outside_file) if c["job"] == job]
    with run.scratch.connect("worker", "overrun check", autocommit=True) as conn:
        runs = conn.execute(q("job_runs_of"), {"id": job}).fetchall()
        state = next(s for s in queue.job_states(conn) if s["id"] == job)
    ev = event_log.read(run.path)
    claims = [e for e in ev if e["event"] == "claim"]
    return {
        "executions": len(calls),
        "completions": sum(1 for r in runs if r[3] is not None),
        "db_runs": len(runs),
        "outside": [f"{c['worker']} attempt {c['attempt']}" for c in calls],
        "status": state["status"], "attempts": state["attempts"],
        "claims": len(claims),
        "first_worker": min(claims, key=lambda e: e["t"])["worker"] if claims else None,
        "beats": sum(1 for e in ev if e["event"] == "heartbeat"),
        "abandoned": sum(1 for e in ev if e["event"] == "abandon"),
        "fenced": sum(1 for e in ev if e["event"] == "fenced"),
        "lease_lost": sum(1 for e in ev if e["event"] == "lease-lost"),
        "taken_over": any(e.get("attempt", 0) >= 2 for e in claims),
        "overlap_s": round(overlap_seconds(ev), 2),
    }
