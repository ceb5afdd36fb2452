"""Finding ``noisy-neighbour`` (beyond the article): one tenant's burst in front of everyone.

Tenant 1 enqueues a burst just before 99 small tenants enqueue a few jobs each; W processes of
the production worker (``python -m tenantlab.jobqueue``, the demo kinds as handlers) drain the
queue, once per claim policy: FIFO (the default), ``--fair round-robin`` and ``--fair limit=N``.
Measured per job, on the server's clock: the wait from enqueue to its first start
(``job_runs``), then per group (the noisy tenant, the small ones) median, p95 and max; per
policy the jobs/s, and every execution (a job run twice would show). While the workers drain,
a live chart samples each group's backlog and how long its oldest queued job has waited so far.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
from psycopg import sql

from .. import db, finding, queue
from ..finding import Result, Verdict, check, knob, plain
from ..queries import q
from ._procs import spawned

CLAIM = ("When one tenant enqueues a burst, a FIFO queue makes every other tenant's next job "
         "wait for the whole burst; a fair claim (round-robin over tenants, or a per-tenant "
         "limit of running jobs) cuts the small tenants' p95 wait at least tenfold, at a "
         "throughput cost measured here.")

ARTICLE: dict[str, Any] = {
    "note": "not in the article: it names the noisy neighbour, measured here beyond it",
}

NOISY = 1  # the tenant with the burst; tenants 2..100 are the small ones
POLICIES = ("fifo", "round-robin", "limit")
RATIO = 10.0  # a fair policy's small-tenant p95 wait must be at least this much lower


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """The burst, the small tenants' jobs, the workers, and which policies run."""

    ARTICLE_SETUP: ClassVar[bool] = False  # the article never ran this: judged on expectations

    burst: int = knob(1000, full=6000, lo=500, hi=10000, step=500, label="burst (tenant 1)")
    small_jobs: int = knob(1, full=3, lo=1, hi=5, label="jobs per small tenant")
    workers: int = knob(4, lo=2, hi=8, label="workers")
    limit: int = knob(1, lo=1, hi=4, label="limit=N (running jobs per tenant)")
    job_ms: float = knob(0.0, lo=0.0, hi=20.0, step=1.0, label="job duration (ms)")
    policy: str = knob("all", choices=("all", *POLICIES), label="policy (FIFO always runs)")

    def policies(self) -> tuple[str, ...]:
        """Return the policies to run: FIFO (the baseline) and the chosen one, or all."""
        return POLICIES if self.policy == "all" else tuple(dict.fromkeys(("fifo", self.policy)))

    def fair(self, policy: str) -> str | None:
        """Return the worker's ``--fair`` value for a policy (None: FIFO)."""
        return {"fifo": None, "round-robin": "round-robin", "limit": f"limit={self.limit}"}[policy]


def worker_argv(name: str, fair: str | None) -> list[str]:
    """Return the production worker's command line, with the lab's demo kinds as handlers."""
    return [sys.executable, "-m", "tenantlab.jobqueue", "worker", "--handlers", "tenantlab.kinds",
            "--name", name, "--poll", "0.2", *(["--fair", fair] if fair else [])]


def _drain(s: db.Scratch, k: Knobs, policy: str,
           sample: Callable[[str, float, list[dict[str, Any]]], None]) -> dict[str, Any]:
    """Start the workers, enqueue the burst then the small tenants, wait until all is done."""
    with s.connect("admin", "noisy reset", autocommit=True) as admin:
        admin.execute(q("reset_queue"))
    argvs = [worker_argv(f"noisy-{policy}-{i + 1}", k.fair(policy)) for i in range(k.workers)]
    kind, seconds = ("sleep", k.job_ms / 1000) if k.job_ms else ("noop", 0.0)
    total = k.burst + 99 * k.small_jobs
    with spawned(argvs, {"JOBQUEUE_DSN": s.worker}) as procs, \
            s.connect("worker", "noisy enqueue", autocommit=True) as conn, \
            s.connect("admin", "noisy watch", autocommit=True) as watch:
        def alive() -> None:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a {policy} worker exited while the queue drained")

        # Every worker is up and waiting before the burst: startup never counts as waiting.
        deadline = time.monotonic() + 60
        like = {"like": f"tenantlab noisy-{policy}-%"}
        while (watch.execute(q("workers_waiting"), like).fetchone() or [0])[0] < k.workers:
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {policy} workers did not start within 60 s")
            time.sleep(0.05)
        t0 = time.time()
        queue.enqueue(conn, kind, tenant=NOISY, count=k.burst, seconds=seconds)
        # Just after the burst, each small tenant in a transaction of its own.
        for tenant in range(2, 101):
            queue.enqueue(conn, kind, tenant=tenant, count=k.small_jobs, seconds=seconds)
        watch.execute(q("analyze_jobs"))
        deadline = time.monotonic() + 60 + total * 0.05
        while True:
            alive()
            rows = watch.execute(q("backlog_by_group"), {"noisy": NOISY}).fetchall()
            sample(policy, time.time() - t0, [
                {"noisy": r[0], "backlog": r[1], "oldest_wait_s": r[2]} for r in rows])
            if sum(r[3] for r in rows) >= total:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {policy} workers did not drain the queue")
            time.sleep(0.2)
        with conn.cursor() as cur:
            cur.execute(q("job_waits"))
            cols = [d.name for d in cur.description or []]
            waits = pd.DataFrame(cur.fetchall(), columns=cols)
        dup = conn.execute(q("run_counts")).fetchone()
    waits["policy"] = policy
    waits["wait_s"] = waits["started"] - waits["created"]
    return {"waits": waits, "duplicates": int(dup[2]) if dup else 0}


def _stats(policy: str, waits: pd.DataFrame, duplicates: int) -> dict[str, Any]:
    small, noisy = waits[waits["tenant_id"] != NOISY], waits[waits["tenant_id"] == NOISY]
    span = waits["finished"].max() - waits["started"].min()
    out: dict[str, Any] = {}
    for name, part in (("small_tenants", small), ("noisy_tenant", noisy)):
        w = part["wait_s"].dropna()
        out[f"{name}_wait_median_s"] = round(float(w.median()), 3) if len(w) else None
        out[f"{name}_wait_p95_s"] = round(float(w.quantile(0.95)), 3) if len(w) else None
        out[f"{name}_wait_max_s"] = round(float(w.max()), 3) if len(w) else None
    # A small tenant's worst wait, tenant by tenant: no tenant left far behind.
    per_tenant = small.groupby("tenant_id")["wait_s"].max()
    out.update({
        "jobs_per_s": round(len(waits) / span, 1) if span > 0 else 0.0,
        "jobs": len(waits),
        "done": int((waits["status"] == "done").sum()),
        "never_started": int(waits["started"].isna().sum()),
        "duplicates": duplicates,
        "worst_small_tenant_wait_s": round(float(per_tenant.max()), 3) if len(per_tenant) else None,
        # When the small tenants' last job started, and when the noisy backlog's last one did.
        "small_tenants_done_s": round(float(small["started"].max() - waits["created"].min()), 3),
        "noisy_backlog_done_s": round(float(noisy["started"].max() - waits["created"].min()), 3),
        "seconds": round(float(span), 2),
    })
    return out


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Drain the same burst once per policy with real worker processes; return the waits."""
    k = knobs or Knobs()
    if k.burst < 1 or k.small_jobs < 1 or k.workers < 1 or k.limit < 1 or k.job_ms < 0:
        raise ValueError("burst, small_jobs, workers and limit must be at least 1, job_ms >= 0")
    if k.policy not in ("all", *POLICIES):
        raise ValueError(f"unknown policy {k.policy!r}; valid: all, {', '.join(POLICIES)}")
    samples: list[dict[str, Any]] = []
    last = [0.0]

    def sample(policy: str, t: float, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            samples.append({"policy": policy, "t": round(t, 3),
                            "tenant": f"tenant {NOISY} (burst)" if r["noisy"]
                            else "small tenants (99)", "backlog": r["backlog"],
                            "oldest_wait_s": round(r["oldest_wait_s"], 3)})
        if live is not None and time.monotonic() - last[0] > 0.3:
            last[0] = time.monotonic()
            live.update(pd.DataFrame(samples))

    parts, measured = [], {}
    with db.scratch("noisy-neighbour") as s:
        for policy in k.policies():
            got = _drain(s, k, policy, sample)
            parts.append(got["waits"])
            measured[policy] = _stats(policy, got["waits"], got["duplicates"])
            if progress:
                progress(1)
    if live is not None:
        live.update(pd.DataFrame(samples))
    measured = plain(measured)
    verdict = judge(measured, k)
    table = pd.DataFrame([{"policy": p, **m} for p, m in measured.items()]).set_index("policy")
    return Result("noisy-neighbour", k, measured, verdict, summary=_summary(measured),
                  table=table, data={"waits": pd.concat(parts, ignore_index=True),
                                     "samples": pd.DataFrame(samples)})


def plans(burst: int = 2000, small_jobs: int = 2, limit: int = 1) -> dict[str, str]:
    """Return the EXPLAIN ANALYZE of each claim on a queue with a burst in front, rolled back.

    For ``claim_limit`` tenant 1 already runs ``limit`` jobs, so the plan shows the walk past
    its backlog (the cost that policy states).
    """
    out = {}
    with db.scratch("noisy plans") as s, s.connect("worker", "noisy plans",
                                                    autocommit=True) as conn:
        queue.enqueue(conn, "noop", tenant=NOISY, count=burst)
        for tenant in range(2, 101):
            queue.enqueue(conn, "noop", tenant=tenant, count=small_jobs)
        with s.connect("admin", "noisy analyze", autocommit=True) as admin:
            admin.execute(q("analyze_jobs"))
        for name, params in (("claim_leased", {}), ("claim_round_robin", {}),
                             ("claim_limit", {"limit": limit})):
            with conn.transaction(force_rollback=True):
                if name == "claim_limit":
                    for _ in range(limit):
                        conn.execute(q("claim_leased"), {"lease": 30, "batch": 1,
                                                         "kinds": ["noop"]})
                # A fixed prefix composed with the named query: no value is formatted into SQL.
                explain = sql.SQL("explain (analyze, costs off, timing off, summary off) ")
                rows = conn.execute(explain + sql.SQL(q(name)),  # type: ignore[arg-type]
                                    {"lease": 30, "batch": 1, "kinds": ["noop"],
                                     **params}).fetchall()
            out[name] = "\n".join(r[0] for r in rows)
    return out


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Each fair policy: small tenants' p95 wait >= 10x lower than FIFO; every job ran once."""
    checks = []
    fifo = measured.get("fifo")
    for policy in POLICIES:
        m = measured.get(policy)
        if m is None:
            continue
        checks.append(check(f"{policy}: every job ran, once",
                            m["done"] == m["jobs"] and m["duplicates"] == 0,
                            f"{m['jobs']} of {m['jobs']}, none twice",
                            f"{m['done']} of {m['jobs']}, {m['duplicates']} twice"))
        if policy == "fifo" or fifo is None:
            continue
        ratio = ratio_of(fifo, m)
        cost = cost_of(fifo, m)
        checks.append(check(
            f"{policy}: small tenants' p95 wait", ratio >= RATIO,
            f"at least {RATIO:g}x lower than FIFO's {fifo['small_tenants_wait_p95_s']:.3g} s",
            f"{m['small_tenants_wait_p95_s']:.3g} s, {ratio:.1f}x lower; {m['jobs_per_s']:g} "
            f"jobs/s vs FIFO {fifo['jobs_per_s']:g} ({cost:+.0%})"))
    return Verdict.of(checks, article=False)


def ratio_of(fifo: dict[str, Any], fair: dict[str, Any]) -> float:
    """Return how many times lower the fair policy's small-tenant p95 wait is than FIFO's."""
    return fifo["small_tenants_wait_p95_s"] / max(fair["small_tenants_wait_p95_s"], 1e-3)


def cost_of(fifo: dict[str, Any], fair: dict[str, Any]) -> float:
    """Return the fair policy's throughput change against FIFO (-0.1 = 10 % fewer jobs/s)."""
    return fair["jobs_per_s"] / fifo["jobs_per_s"] - 1 if fifo["jobs_per_s"] else 0.0


def _summary(m: dict[str, Any]) -> str:
    parts = []
    for policy, s in m.items():
        text = (f"{policy}: small tenants p95 {s['small_tenants_wait_p95_s']:.3g} s, noisy p95 "
                f"{s['noisy_tenant_wait_p95_s']:.3g} s, {s['jobs_per_s']:g} jobs/s")
        if policy != "fifo" and "fifo" in m:
            text += f" ({ratio_of(m['fifo'], s):.1f}x lower, {cost_of(m['fifo'], s):+.0%} jobs/s)"
        parts.append(text)
    return "; ".join(parts)
