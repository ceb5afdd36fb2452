"""Finding ``rls-jobs``: the tenant policy on the jobs table hides every job from the worker.

100 jobs, one per tenant. The admin puts the invoices' tenant policy on ``jobs`` too (in this
experiment's own scratch database). A worker without tenant context then sees 0 of 100 jobs and
both claims return nothing: no error, an apparently empty queue. A worker process started on
it finds nothing to do and exits. The fix: keep the jobs table out of the tenant policy and run
the work as the tenant with the local form; the same worker process then runs all 100, each
counting exactly its own tenant's invoices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from .. import db, finding, queue, tenant
from ..finding import Result, Verdict, check, knob, plain
from ..queries import q
from ._workers import WorkersRun, workers_run

CLAIM = ("With the tenant policy on the jobs table too, a worker without tenant context sees 0 "
         "of 100 jobs and its claim returns nothing, without an error: an apparently empty "
         "queue.")

ARTICLE: dict[str, Any] = {
    "visible_without_tenant": 0, "total_jobs": 100, "claimed": 0, "error": None,
    "fix": "keep jobs out of the tenant policy; run the work as the tenant with set_config(..., true)",
}


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """Jobs spread over tenants 1..100 in turn; the article's 100 is the workshop size too."""

    jobs: int = knob(100, lo=10, hi=1000, step=10, label="jobs")


def _worker_process(run: WorkersRun, name: str) -> tuple[int, pd.DataFrame]:
    proc = run.start(design="leased", name=name, until_empty=True, poll=0.05, lease=30.0)
    code = run.wait(proc)
    ev = run.events()
    return code, ev[ev["worker"] == name]


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Show the trap and the fix; return the script's steps (table), measured values, events."""
    k = knobs or Knobs.sized()
    jobs = k.jobs
    if not 1 <= jobs <= 10_000:
        raise ValueError(f"jobs must be 1..10000, not {jobs}")
    steps: list[dict[str, Any]] = []

    def step(who: str, does: str, seen: Any) -> None:
        steps.append({"who": who, "does": does, "seen": seen})

    with workers_run("rls_jobs", live) as r:
        with (r.scratch.connect("admin", "rls-jobs admin", autocommit=True) as admin,
              r.scratch.connect("worker", "rls-jobs worker", autocommit=True) as conn):
            queue.enqueue(conn, "count", count=jobs)
            # Counted before the policy: a managed-service admin (no superuser, no BYPASSRLS)
            # is under the policy too, and would count 0.
            total = db.scalar(admin, q("count_jobs"))
            admin.execute(q("jobs_tenant_policy"))
            step("admin", "counts jobs; puts the tenant policy on jobs", total)
            visible = db.scalar(conn, q("count_jobs"))
            step("worker (no tenant set)", "counts jobs", visible)
            error = None
            try:
                leased = queue.Leased(lease=30.0).claim(conn)
                single = queue.SingleTransaction().run_one(conn)
            except Exception as e:  # the article saw none; say so if this server differs
                leased = single = None
                error = f"{type(e).__name__}: {e}"
            claimed = int(leased is not None) + int(single is not None)
            step("worker (no tenant set)", "claims a job (leased, then single transaction)",
                 "nothing, no error" if not claimed and error is None else error or claimed)
            with conn.transaction():
                tenant.set_tenant(conn, 7, local=True)
                as_tenant_7 = db.scalar(conn, q("count_jobs"))
            step("worker (tenant 7 set locally)", "counts jobs", as_tenant_7)
            if progress:
                progress(1)
            code, ev = _worker_process(r, "worker-with-policy")
            ran_with_policy = int((ev["event"] == "claim").sum())
            step("worker process", "starts, polls, exits on an empty queue",
                 f"{ran_with_policy} jobs claimed")

            admin.execute(q("jobs_drop_tenant_policy"))
            step("admin", "takes the jobs table out of the tenant policy", "")
            after = db.scalar(conn, q("count_jobs"))
            step("worker (no tenant set)", "counts jobs", after)
            code, ev = _worker_process(r, "worker-after-fix")
            done = sum(s["status"] == "done" for s in queue.job_states(conn))
            right = _counted_right(ev)
            step("worker process", "claims each job, sets its tenant locally, counts invoices",
                 f"{done} done, {right} counted exactly their tenant's invoices")
            if progress:
                progress(1)
        events = r.events()
    measured = {"visible_without_tenant": visible, "total_jobs": total, "claimed": claimed,
                "error": error, "visible_as_tenant_7": as_tenant_7,
                "claimed_by_worker_process": ran_with_policy, "visible_after_fix": after,
                "done_after_fix": done, "counted_right_after_fix": right}
    measured = plain(measured)
    return Result("rls-jobs", k, measured, judge(measured, k), table=pd.DataFrame(steps),
                  events=events)


def _counted_right(ev: pd.DataFrame) -> int:
    """Count finished jobs whose result is exactly floor(20000 / tenant)."""
    claims = ev[ev["event"] == "claim"].set_index("job")["tenant"]
    fin = ev[ev["event"] == "finish"]
    return int(sum(int(r.result) == 20000 // int(claims[r.job]) for r in fin.itertuples()))


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Judge the trap (nothing visible, nothing claimed, no error) and the fix (all visible)."""
    k, m = knobs or Knobs(), measured
    total = m["total_jobs"]
    return Verdict.of([
        check("jobs visible without tenant context", m["visible_without_tenant"] == 0 and total > 0,
              f"0 of {total}", f"{m['visible_without_tenant']} of {total}"),
        check("claim without tenant context", m["claimed"] == 0 and m["error"] is None,
              "nothing, no error",
              f"{m['claimed']} jobs, " + ("no error" if m["error"] is None else m["error"])),
        check("jobs visible after the fix", m["visible_after_fix"] == total,
              f"{total} of {total}", f"{m['visible_after_fix']} of {total}"),
    ], article=k.is_article_setup())
