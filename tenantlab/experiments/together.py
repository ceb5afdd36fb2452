"""Every fault at once: the corrected worker against the naive one (notebook 09).

A demonstration, not a finding (``experiments.DEMONSTRATIONS``): the article makes no claim
about all faults together, so ``reproduce`` does not run it; its checks are the expectation
that the corrected worker survives what each finding shows one at a time.

One mixed queue of many tenants' jobs: poison jobs first in line, jobs that crash their worker,
jobs that outlive their lease and call the outside world, ordinary jobs that count a tenant's
invoices, and a session that keeps a transaction open. Several worker processes work it, and a
supervisor restarts any worker that dies, as systemd or Kubernetes would.

- **naive**: the single-transaction queue without error handling, no reaper, the holder left
  alone;
- **corrected**: the leased claim counted at claim, heartbeat, fenced finish, maximum runtime,
  backoff, the reaper, and ``idle_in_transaction_session_timeout`` on the holder.

The run stops when every job is done or dead, or at the time limit: the naive queue never
settles, the corrected one gets up to ``corrected_limit`` (a busy machine must not pass for a lost
job). What is measured: jobs done, dead, lost (neither done nor dead at the end), executed twice
in the outside world, rows read under the wrong tenant, worker crashes, and the fetch latency
while it ran.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from jobqueue import Reaper, ReaperConfig

from .. import db, monitor, outside, queue
from ..finding import Verdict, check
from ..queries import q
from ._workers import workers_run

DESIGNS = ("naive", "corrected")


@dataclass
class Mix:
    """The queue: how many jobs of each kind, and the knobs of the corrected worker."""

    count_jobs: int = 60
    poison: int = 2
    crashes: int = 2
    overruns: int = 2
    workers: int = 3
    lease: float = 2.0
    heartbeat: float = 0.5
    max_runtime: float = 10.0
    overrun_seconds: float = 3.0  # longer than the lease: without a heartbeat it runs twice
    holder_timeout: float = 2.0  # idle_in_transaction_session_timeout (corrected only)
    time_limit: float = 25.0  # the naive queue never settles: stop it here
    # The corrected queue settles: let it, on a busy machine too (a job not settled by then
    # counts as lost).
    corrected_limit: float = 120.0

    def __post_init__(self) -> None:
        if self.workers < 1 or self.count_jobs < 0:
            raise ValueError("workers must be at least 1 and count_jobs 0 or more")
        if not 0 < self.heartbeat < self.lease:
            raise ValueError(f"heartbeat must be shorter than the lease ({self.lease} s), "
                             f"not {self.heartbeat}")


@dataclass
class Result:
    design: str
    summary: dict[str, Any]
    jobs: pd.DataFrame
    events: pd.DataFrame
    fetch_ms: list[float] = field(default_factory=list)


def _enqueue(conn: Any, mix: Mix) -> None:
    """Queue the mix: the poison jobs first in line, the rest interleaved across tenants."""
    queue.enqueue(conn, "fail", tenant=7, count=mix.poison)
    faults = ["crash"] * mix.crashes + ["outside"] * mix.overruns
    every = max(1, mix.count_jobs // max(len(faults), 1))
    tenant = 0
    for i in range(mix.count_jobs):
        if faults and i % every == every // 2:
            kind = faults.pop(0)
            seconds = 0.2 if kind == "crash" else mix.overrun_seconds
            queue.enqueue(conn, kind, tenant=1 + (i * 13) % 100, seconds=seconds)
        tenant = 1 + (i * 37) % 100
        queue.enqueue(conn, "count", tenant=tenant)
    for kind in faults:
        queue.enqueue(conn, kind, tenant=5, seconds=0.2 if kind == "crash" else mix.overrun_seconds)


def _options(design: str, mix: Mix, name: str) -> dict[str, Any]:
    if design == "naive":
        return {"design": "single", "name": name, "poll": 0.1}
    return {"design": "leased", "name": name, "poll": 0.1, "lease": mix.lease,
            "heartbeat": mix.heartbeat, "max_runtime": mix.max_runtime, "backoff": 0.2}


def run(design: str = "corrected", *, mix: Mix | None = None, live: Any = None,
        progress: Any = None) -> Result:
    """Run the mixed queue through one design; return what became of every job."""
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {', '.join(DESIGNS)}, not {design!r}")
    mix = mix or Mix()
    with workers_run(f"together_{design}", live) as run_:
        s = run_.scratch
        ledger = run_.path.with_name("outside.jsonl")
        run_.fleet.env[outside.FILE_ENV] = str(ledger)
        with s.connect("worker", "enqueue", autocommit=True) as conn:
            _enqueue(conn, mix)
            total = db.scalar(conn, q("count_jobs"))
        timeout = mix.holder_timeout if design == "corrected" else None
        fetch_ms: list[float] = []
        crashes = 0
        with (monitor.Holder(s.worker, "xid", idle_timeout=timeout) as holder,
              s.connect("worker", "probe", autocommit=True) as probe,
              s.connect("worker", "reaper", autocommit=True) as reaper_conn):
            # A grace of one lease: room for a late beat, and still within the run.
            reaper = Reaper(reaper_conn, ReaperConfig(grace=mix.lease), run_.log("reaper"))
            procs = [run_.start(**_options(design, mix, f"w{i + 1}")) for i in range(mix.workers)]
            started = time.monotonic()
            limit = mix.corrected_limit if design == "corrected" else mix.time_limit
            while time.monotonic() - started < limit:
                for i, p in enumerate(procs):
                    if p.poll() is not None:  # a worker died: the supervisor starts another
                        crashes += 1
                        name = f"w{mix.workers + crashes}"
                        procs[i] = run_.start(**_options(design, mix, name))
                if design == "corrected":
                    reaper.run_once()
                t = time.perf_counter()
                probe.execute(q("together_probe")).fetchone()
                fetch_ms.append((time.perf_counter() - t) * 1000)
                settled = db.scalar(probe, q("together_settled"))
                if progress:
                    progress(settled, total)
                if settled == total:
                    break
                run_.sleep(0.25)
            elapsed = time.monotonic() - started
            holder_ended = not holder.alive()
            for p in procs:
                run_.stop(p)
        with s.connect("admin", "results") as conn:
            jobs = pd.DataFrame(queue.job_states(conn))
        events = run_.events()
        executions = pd.DataFrame(outside.read(ledger), columns=["job", "attempt", "worker"])
    summary = _summarise(design, jobs, events, executions, fetch_ms, crashes, elapsed,
                         holder_ended)
    return Result(design, summary, jobs, events, fetch_ms)


def _summarise(design: str, jobs: pd.DataFrame, events: pd.DataFrame, executions: pd.DataFrame,
               fetch_ms: list[float], crashes: int, elapsed: float, holder_ended: bool
               ) -> dict[str, Any]:
    status = jobs["status"].value_counts().to_dict()
    twice = executions.groupby("job").size() if len(executions) else pd.Series(dtype=int)
    claims = events[events["event"] == "claim"]
    kind_of = dict(zip(jobs["id"], jobs["kind"], strict=True))
    return {
        "design": design,
        "jobs": int(len(jobs)),
        "done": int(status.get("done", 0)),
        "dead": int(status.get("dead", 0)),
        "lost": int(len(jobs) - status.get("done", 0) - status.get("dead", 0)),
        "executed_twice": int((twice > 1).sum()),
        "wrong_tenant_rows": _wrong_tenant_rows(events, jobs),
        "worker_crashes": crashes,
        "poison_picks": int(sum(kind_of.get(j) == "fail" for j in claims["job"])),
        "fetch_ms_median": round(statistics.median(fetch_ms), 3) if fetch_ms else None,
        "holder_ended_by_timeout": holder_ended,
        "seconds": round(elapsed, 1),
    }


def _wrong_tenant_rows(events: pd.DataFrame, jobs: pd.DataFrame) -> int:
    """Sum, over finished count jobs, the rows seen beyond the job's own tenant's invoices."""
    if "result" not in events:
        return 0
    tenant_of = dict(zip(jobs["id"], jobs["tenant_id"], strict=True))
    kind_of = dict(zip(jobs["id"], jobs["kind"], strict=True))
    wrong = 0
    for r in events[events["event"] == "finish"].itertuples():
        if kind_of.get(r.job) == "count" and pd.notna(r.result):
            wrong += abs(int(r.result) - 20000 // tenant_of[r.job])
    return wrong


def compare(mix: Mix | None = None, live: dict[str, Any] | None = None,
            progress: Any = None) -> dict[str, Result]:
    """Run both designs on the same mix; return {design: Result}."""
    live = live or {}
    return {d: run(d, mix=mix, live=live.get(d), progress=progress) for d in DESIGNS}


def table(results: dict[str, Result]) -> pd.DataFrame:
    """Return the side-by-side summary, one column per design."""
    rows = ["jobs", "done", "dead", "lost", "executed_twice", "wrong_tenant_rows",
            "worker_crashes", "poison_picks", "fetch_ms_median", "holder_ended_by_timeout",
            "seconds"]
    return pd.DataFrame({d: [r.summary[k] for k in rows] for d, r in results.items()},
                        index=rows)


def verdict(results: dict[str, Result]) -> Verdict:
    """Check the corrected run against what we expect of it (and the naive one's loss)."""
    c = results["corrected"].summary
    checks = [
        check("corrected: jobs lost", c["lost"] == 0, 0, c["lost"]),
        check("corrected: jobs executed twice", c["executed_twice"] == 0, 0, c["executed_twice"]),
        check("corrected: rows read under the wrong tenant", c["wrong_tenant_rows"] == 0, 0,
              c["wrong_tenant_rows"]),
        check("corrected: idle holder ended by the timeout", c["holder_ended_by_timeout"],
              True, c["holder_ended_by_timeout"]),
    ]
    if n := results.get("naive"):
        checks.append(check("naive: jobs left behind", n.summary["lost"] > 0,
                            "some", f"{n.summary['lost']} of {n.summary['jobs']}"))
    return Verdict.of(checks, article=False)
