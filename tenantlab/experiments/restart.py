"""Finding ``restart``: PostgreSQL restarts abruptly under running workers, twice.

Beyond the article. A throwaway cluster of the experiment's own (tenantlab/experiments/
_cluster.py: the lab's server is never restarted) holds two queues of many tenants' jobs, each
job a call to the outside world with the job id as its idempotency key (``outside_once``):
one queue served by production workers (``tenantlab worker --design leased``), the other by
the naive single-transaction design (``--design single``), both in the production loop. The
server is stopped as by a power cut (an immediate shutdown) and started again, once at
an arbitrary moment and once right after a claim. Measured: jobs lost, jobs finished twice,
calls made more than once per job and why, workers that exited, time until jobs finish again;
and the idempotency key's effect: calls made vs effects that took place.

Why a call repeats: a job whose outside call went through but whose finish did not commit
before the crash is retried (its lease expires): at-least-once. The fence cannot reach the
outside world; a key the outside world deduplicates on can.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import psycopg

from .. import db, finding, outside, queue
from ..finding import Result, Verdict, check, knob, plain
from ..queries import q
from ..settings import OUTSIDE
from . import _cluster
from ._workers import Fleet

CLAIM = ("An abrupt PostgreSQL restart under running workers loses no job and finishes none "
         "twice, and the production workers reconnect by themselves; a job whose outside call "
         "happened before the crash is retried and calls again (at-least-once), which an "
         "idempotency key (the job id) deduplicated by the outside world absorbs.")

ARTICLE: dict[str, Any] = {
    "note": "not in the article: beyond it (measured on a throwaway cluster, never the lab's "
            "server)",
}

DESIGNS = {"production": "leased", "naive": "single"}


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """Jobs per queue, workers per design, the work's seconds, how long the server stays down."""

    ARTICLE_SETUP: ClassVar[bool] = False

    jobs: int = knob(150, full=2000, lo=50, hi=2000, step=50, label="jobs per queue")
    workers: int = knob(2, lo=1, hi=4, label="workers per design")
    job: float = knob(0.03, lo=0.0, hi=0.2, step=0.01, label="work per job (s)")
    lease: float = knob(2.0, lo=0.5, hi=6.0, step=0.5, label="lease (s)")
    down_for: float = knob(0.0, lo=0.0, hi=5.0, step=0.5, label="server down for (s)")


@dataclass
class Queue:
    """One design's queue: its scratch database, outside world, event log and workers."""

    design: str
    scratch: db.Scratch
    fleet: Fleet
    outside: Path
    events: Path
    procs: list[Any]


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Restart a throwaway cluster twice under both designs' workers; measure what survived."""
    k = knobs or Knobs.sized()
    if why := _cluster.available():
        m = {"skipped": f"no throwaway cluster here: {why}"}
        return Result("restart", k, m, judge(m, k))
    with _cluster.cluster("restart") as c, tempfile.TemporaryDirectory(prefix="tenantlab-") as tmp:
        with db.scratch("restart production", c.dsn) as prod, \
                db.scratch("restart naive", c.dsn) as naive:
            queues = [_queue(name, s, Path(tmp), k) for name, s in
                      (("production", prod), ("naive", naive))]
            try:
                for qu in queues:
                    _start(qu, k)
                restarts = _restarts(c, queues, k, live, progress)
                settled_s = _settle(c, queues, timeout=60.0)
                exited = {qu.design: sum(p.poll() is not None for p in qu.procs) for qu in queues}
            finally:
                for qu in queues:
                    qu.fleet.close()
            outcome = {qu.design: _outcome(qu) for qu in queues}
            claimed = _claimed_job(prod, outcome["production"], restarts[-1].get("job"))
    measured = _measured(k, outcome, exited, restarts, settled_s, claimed)
    table = pd.DataFrame([{"design": d, **o["counts"]} for d, o in outcome.items()])
    return Result("restart", k, measured, judge(measured, k),
                  table=table, data={"restarts": restarts, "outcome": outcome})


def _queue(design: str, s: db.Scratch, tmp: Path, k: Knobs) -> Queue:
    with s.connect("worker", "restart enqueue", autocommit=True) as conn:
        queue.enqueue(conn, "outside_once", count=k.jobs, seconds=k.job, max_attempts=5)
    fleet = Fleet(s.worker)
    fleet.env[OUTSIDE] = str(tmp / f"{design}-outside.jsonl")
    return Queue(design, s, fleet, Path(fleet.env[OUTSIDE]), tmp / f"{design}-events.jsonl", [])


def _start(qu: Queue, k: Knobs) -> None:
    opts: dict[str, Any] = {"design": DESIGNS[qu.design], "poll": 0.2}
    if qu.design == "production":
        opts.update(lease=k.lease, heartbeat=k.lease / 4, backoff=0.0)
    for i in range(k.workers):
        qu.procs.append(qu.fleet.start(events=qu.events, name=f"{qu.design[0]}{i + 1}", **opts))


def _done(dsn: str) -> int | None:
    """Return how many jobs are done now, None while the server is away."""
    try:
        with db.connect(dsn, "restart probe", autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(q("restart_outcome")).fetchone()
    except psycopg.OperationalError:
        return None
    return None if row is None else int(row[1])


def _restarts(c: _cluster.Cluster, queues: list[Queue], k: Knobs, live: Any,
              progress: Any) -> list[dict[str, Any]]:
    prod = queues[0]
    out = []
    # 1. At an arbitrary moment: once about a fifth of the production queue is done.
    _wait(lambda: (_done(prod.scratch.admin) or 0) >= k.jobs // 5, 60.0, "first jobs done")
    out.append(_restart(c, prod, k, "an arbitrary moment", None))
    if progress:
        progress(1)
    # 2. Right after a claim: the next claim a production worker logs after the first restart.
    seen = prod.events.stat().st_size
    # Polled every 2 ms: the stop must land while the claimed job still works.
    _wait(lambda: _new_claim(prod, seen) is not None, 60.0, "a claim after the restart", 0.002)
    claim = _new_claim(prod, seen)
    out.append(_restart(c, prod, k, "right after a claim", claim))
    if progress:
        progress(1)
    return out


def _new_claim(qu: Queue, offset: int) -> dict[str, Any] | None:
    """Return the first claim logged after byte `offset` of the event log (None: none yet)."""
    with qu.events.open("rb") as f:
        f.seek(offset)
        for line in f.read().splitlines():
            if b'"event": "claim"' in line:
                try:
                    return dict(json.loads(line))
                except json.JSONDecodeError:
                    return None  # half-written: the next look sees it whole
    return None


def _restart(c: _cluster.Cluster, prod: Queue, k: Knobs, when: str,
             claim: dict[str, Any] | None) -> dict[str, Any]:
    done_before = _done(prod.scratch.admin) if claim is None else None
    at = c.crash_restart(k.down_for)
    # Recovered: a production job finished after the stop (the workers are back at work).
    _wait(lambda: _finished_since(prod.scratch.admin, at) > 0, 120.0, "jobs finishing again")
    row = {"when": when, "recovered_s": round(time.time() - at, 2), "at": at,
           "done_before": done_before}
    if claim is not None:
        row.update(job=claim["job"], attempt=claim["attempt"],
                   claimed_before_stop_s=round(at - claim["t"], 3))
    return row


def _finished_since(dsn: str, at: float) -> int:
    try:
        with db.connect(dsn, "restart probe", autocommit=True, connect_timeout=2) as conn:
            return int(db.scalar(conn, q("restart_finished_since"), {"since": at}))
    except psycopg.OperationalError:
        return 0


def _wait(done: Any, timeout: float, what: str, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"restart: {what} did not happen within {timeout:g} s")
        time.sleep(every)


def _settle(c: _cluster.Cluster, queues: list[Queue], timeout: float) -> float:
    """Wait until every job of both queues is done or dead (or the timeout); return seconds."""
    started = time.monotonic()
    for qu in queues:
        def settled(qu: Queue = qu) -> bool:
            with db.connect(qu.scratch.admin, "restart probe", autocommit=True) as conn:
                row = conn.execute(q("restart_outcome")).fetchone()
            return row is not None and row[3] == 0
        try:
            _wait(settled, max(1.0, timeout - (time.monotonic() - started)), "every job settled")
        except TimeoutError:
            break  # what is left unfinished is counted as lost
    return round(time.monotonic() - started, 2)


def _outcome(qu: Queue) -> dict[str, Any]:
    with qu.scratch.connect("admin", "restart result", autocommit=True) as conn:
        jobs, done, dead, unfinished, twice, attempts = conn.execute(
            q("restart_outcome")).fetchone()  # type: ignore[misc]
    calls = outside.read(qu.outside)
    per_job = Counter(c["job"] for c in calls)
    repeated = {j: n for j, n in per_job.items() if n > 1}
    return {"counts": {"jobs": jobs, "done": done, "dead": dead, "lost": jobs - done,
                       "finished_twice": twice, "attempts": attempts, "calls": len(calls),
                       "jobs_called": len(per_job),
                       "side_effects_repeated": sum(n - 1 for n in repeated.values()),
                       "effects_with_key": sum(1 for c in calls if c.get("effect")),
                       # Calls made again by the same attempt: not a retry after the crash.
                       "repeated_within_an_attempt": sum(
                           n - len({c["attempt"] for c in calls if c["job"] == j})
                           for j, n in repeated.items())},
            "repeated": [{"job": j, "calls": n,
                          "attempts": [c["attempt"] for c in calls if c["job"] == j]}
                         for j, n in sorted(repeated.items())]}


def _measured(k: Knobs, outcome: dict[str, Any], exited: dict[str, int],
              restarts: list[dict[str, Any]], settled_s: float,
              claimed: dict[str, Any] | None) -> dict[str, Any]:
    p = outcome["production"]["counts"]
    return plain({
        "jobs": p["jobs"], "lost": p["lost"], "finished_twice": p["finished_twice"],
        "side_effects_repeated": p["side_effects_repeated"],
        "effects_with_idempotency_key": p["effects_with_key"],
        "calls_made": p["calls"],
        "repeated_within_an_attempt": p["repeated_within_an_attempt"],
        "workers_exited": exited,
        "recovered_s": max(r["recovered_s"] for r in restarts),
        "restarts": [{key: r.get(key) for key in ("when", "recovered_s", "job", "attempt")}
                     for r in restarts],
        "claimed_job": claimed,
        "naive": {key: outcome["naive"]["counts"][key] for key in (
            "jobs", "lost", "finished_twice", "side_effects_repeated", "effects_with_key",
            "calls", "repeated_within_an_attempt")},
        "settled_s": settled_s,
        "settings": {"jobs": k.jobs, "workers": k.workers, "job": k.job, "lease": k.lease,
                     "down_for": k.down_for},
    })


def _claimed_job(s: db.Scratch, o: dict[str, Any], job: int | None) -> dict[str, Any] | None:
    """Return what became of the job claimed right before the second restart."""
    if job is None:
        return None
    with s.connect("admin", "restart result", autocommit=True) as conn:
        row = conn.execute(q("restart_job"), {"id": job}).fetchone()
    rep = next((r for r in o["repeated"] if r["job"] == job), None)
    return {"job": job, "status": row[0] if row else None, "attempts": row[1] if row else None,
            "calls": rep["calls"] if rep else 1}


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Judge: nothing lost, nothing finished twice, no production worker exited, key dedupes."""
    if "skipped" in measured:
        return Verdict.of([check("a throwaway cluster", False, "PostgreSQL binaries here",
                                 measured["skipped"])], article=False)
    m = measured
    ex = m["workers_exited"]
    jobs_called = m["calls_made"] - m["side_effects_repeated"]
    return Verdict.of([
        check("jobs lost", m["lost"] == 0, 0, m["lost"]),
        check("jobs finished twice", m["finished_twice"] == 0, 0, m["finished_twice"]),
        check("production workers that exited", ex["production"] == 0, 0, ex["production"]),
        check("the server came back, jobs finish again", m["recovered_s"] is not None, "yes",
              f"after {m['recovered_s']:.1f} s at worst"),
        check("calls repeated: at-least-once", m.get("repeated_within_an_attempt", 0) == 0,
              "0 or more, each by a new attempt (a call before the crash, its finish lost)",
              f"{m['side_effects_repeated']} of {m['calls_made']} calls, "
              f"{m.get('repeated_within_an_attempt', 0)} by the same attempt"),
        check("effects with the idempotency key", m["effects_with_idempotency_key"]
              == jobs_called, "one per job called", f"{m['effects_with_idempotency_key']} for "
              f"{jobs_called} jobs ({m['calls_made']} calls)"),
        check("naive queue: jobs lost, finished twice", m["naive"]["lost"] == 0
              and m["naive"]["finished_twice"] == 0, "0, 0 (one transaction per job)",
              f"{m['naive']['lost']}, {m['naive']['finished_twice']}; {ex['naive']} naive "
              "workers exited"),
    ], article=False)
