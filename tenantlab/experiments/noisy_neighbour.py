"""Finding ``noisy-neighbour`` (beyond the article): one tenant's burst in front of everyone.

Tenant 1 enqueues a burst and 99 small tenants enqueue a few jobs each; W processes of the
production worker (``python -m jobqueue``, the demo kinds as handlers) drain the
queue, once per claim policy: FIFO (the default), ``--fair round-robin`` and ``--fair limit=N``.
Two arrivals, each drained by the same worker processes of a policy:

- ``during the drain``: the workers are already waiting; the burst arrives, and just after it
  each small tenant's jobs in a transaction of their own, while the workers drain the burst;
- ``queued first``: the burst and every small tenant's jobs are queued in one transaction, so
  all of it is there before the workers claim anything.

Measured per job, on the server's clock: the wait from enqueue to its first start
(``job_runs``), then per group (the noisy tenant, the small ones) median, p95 and max; per
policy the jobs/s, the order (did every small tenant start before the burst drained, 99 % of it started?), and
every execution (a job run twice would show). A fair claim cuts the small tenants' wait most
when they arrive during the drain (FIFO puts them behind what is left of the burst, a fair
claim serves them at once); with everything queued first each small tenant still waits for its
turn in the first round, so the cut is smaller. While the workers drain, a live chart samples
each group's backlog and how long its oldest queued job has waited so far.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
from jobqueue import Leased
from psycopg import sql

from .. import db, finding, queue
from ..finding import Result, Verdict, check, knob, plain
from ..queries import q
from ._procs import spawned

CLAIM = ("When one tenant enqueues a burst, a FIFO queue makes every other tenant's next job "
         "wait for the whole burst; a fair claim (round-robin over tenants, or a per-tenant "
         "limit of running jobs) starts every small tenant's job before the burst drains. "
         "When the small tenants' jobs arrive while the workers drain the burst, that cuts "
         "their p95 wait at least tenfold; when everything was queued before the workers "
         "start, each still waits its turn in the first round over the tenants and the cut is "
         "smaller (a few to ten times at the workshop's burst of 1,000). The throughput cost "
         "is measured here.")

ARTICLE: dict[str, Any] = {
    "note": "not in the article: it names the noisy neighbour, measured here beyond it",
}

NOISY = 1  # the tenant with the burst; tenants 2..100 are the small ones
POLICIES = ("fifo", "round-robin", "limit")
RATIO = 10.0  # arriving during the drain: a fair policy's small-tenant p95 wait this much lower
#: The arrivals, by their key in ``measured``: the policies' own keys (the first arrival, the
#: finding's first measurement) and ``queued_first``.
ARRIVALS = {"during_drain": "arriving during the drain", "queued_first": "all queued first"}


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """The burst, the small tenants' jobs, the workers, and which policies run."""

    ARTICLE_SETUP: ClassVar[bool] = False  # the article never ran this: judged on expectations

    burst: int = knob(1000, full=6000, at_least=1, lo=500, hi=10000, step=500, label="burst (tenant 1)")
    small_jobs: int = knob(1, full=3, at_least=1, lo=1, hi=5, label="jobs per small tenant")
    workers: int = knob(4, at_least=1, lo=2, hi=8, label="workers")
    limit: int = knob(1, at_least=1, lo=1, hi=4, label="limit=N (running jobs per tenant)")
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
    return [sys.executable, "-m", "jobqueue", "worker", "--handlers", "tenantlab.kinds",
            "--name", name, "--poll", "0.2", *(["--fair", fair] if fair else [])]


def _drain(s: db.Scratch, k: Knobs, policy: str,
           sample: Callable[[str, str, float, list[dict[str, Any]]], None]
           ) -> dict[str, dict[str, Any]]:
    """Start the workers once; per arrival, queue the jobs and wait until all is done."""
    argvs = [worker_argv(f"noisy-{policy}-{i + 1}", k.fair(policy)) for i in range(k.workers)]
    out = {}
    with spawned(argvs, {"JOBQUEUE_DSN": s.worker}) as procs, \
            s.connect("worker", "noisy enqueue", autocommit=True) as conn, \
            s.connect("admin", "noisy watch", autocommit=True) as watch:
        def alive() -> None:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a {policy} worker exited while the queue drained")

        # Every worker is up and waiting before the burst: startup never counts as waiting.
        deadline = time.monotonic() + 60
        like = {"like": f"jobqueue noisy-{policy}-%"}
        while (watch.execute(q("workers_waiting"), like).fetchone() or [0])[0] < k.workers:
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {policy} workers did not start within 60 s")
            time.sleep(0.05)
        for arrival in ARRIVALS:
            watch.execute(q("reset_queue"))
            out[arrival] = _arrive(k, policy, arrival, conn, watch, alive,
                                   functools.partial(sample, policy, arrival))
    return out


def _arrive(k: Knobs, policy: str, arrival: str, conn: Any, watch: Any,
            alive: Callable[[], None], sample: Callable[[float, list[dict[str, Any]]], None]
            ) -> dict[str, Any]:
    """Queue the burst and the small tenants' jobs as `arrival` says; wait until all is done."""
    kind, seconds = ("sleep", k.job_ms / 1000) if k.job_ms else ("noop", 0.0)
    total = k.burst + 99 * k.small_jobs

    def small() -> None:
        for tenant in range(2, 101):
            queue.enqueue(conn, kind, tenant=tenant, count=k.small_jobs, seconds=seconds)

    t0, claimable = time.time(), None
    if arrival == "queued_first":
        # One transaction: all of it becomes claimable at once, the burst first (by id). The
        # waits count from the commit, not from each row's insert before it.
        with conn.transaction():
            queue.enqueue(conn, kind, tenant=NOISY, count=k.burst, seconds=seconds)
            small()
        claimable = (conn.execute(q("server_clock")).fetchone() or [None])[0]
    else:
        queue.enqueue(conn, kind, tenant=NOISY, count=k.burst, seconds=seconds)
        small()  # just after the burst, each small tenant in a transaction of its own
    watch.execute(q("analyze_jobs"))
    deadline = time.monotonic() + 60 + total * 0.05
    while True:
        alive()
        rows = watch.execute(q("backlog_by_group"), {"noisy": NOISY}).fetchall()
        sample(time.time() - t0, [
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
    waits["arrival"] = ARRIVALS[arrival]
    # When each job could first be claimed: its insert, or the commit of the one transaction.
    waits["claimable"] = waits["created"] if claimable is None else \
        waits["created"].clip(lower=claimable)
    waits["wait_s"] = waits["started"] - waits["claimable"]
    return {"waits": waits, "duplicates": int(dup[2]) if dup else 0}


def drain(s: db.Scratch, policy: str, knobs: Knobs | None = None) -> dict[str, dict[str, Any]]:
    """Drain each arrival once with `policy`'s worker processes, no chart: each arrival's
    measures (jobs/s, the groups' waits; ``tenantlab bench``'s noisy-neighbour rows)."""
    k = knobs or Knobs()
    got = _drain(s, k, policy, lambda *_: None)
    return {arrival: _stats(policy, g["waits"], g["duplicates"]) | _phases(g["waits"])
            for arrival, g in got.items()}


def _phases(waits: pd.DataFrame) -> dict[str, Any]:
    """Return the drain's two phases: while small tenants still start jobs (up to their last
    start), then the burst's jobs alone; each one's jobs (started in it) and jobs/s."""
    small_last = waits.loc[waits["tenant_id"] != NOISY, "started"].max()
    first, last = waits["started"].min(), waits["finished"].max()
    alone = int((waits["started"] > small_last).sum())
    return {"several_tenants_jobs": len(waits) - alone,
            "several_tenants_jobs_per_s": round((len(waits) - alone)
                                                / max(small_last - first, 1e-3), 1),
            "burst_alone_jobs": alone,
            "burst_alone_jobs_per_s": round(alone / max(last - small_last, 1e-3), 1)}


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
        # The order, not a duration: did the small tenants' last job start before the burst
        # drained (99 % of its jobs started)? Not its very last job: a worker descheduled
        # between its claim and its start on a loaded machine would decide it alone.
        "small_tenants_before_burst_drained": bool(small["started"].max()
                                                   < noisy["started"].quantile(0.99)),
        "seconds": round(float(span), 2),
    })
    return out


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Drain the same burst once per policy with real worker processes; return the waits."""
    k = knobs or Knobs.sized()
    samples: list[dict[str, Any]] = []
    last = [0.0]

    def sample(policy: str, arrival: str, t: float, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            samples.append({"policy": policy, "arrival": ARRIVALS[arrival], "t": round(t, 3),
                            "tenant": f"tenant {NOISY} (burst)" if r["noisy"]
                            else "small tenants (99)", "backlog": r["backlog"],
                            "oldest_wait_s": round(r["oldest_wait_s"], 3)})
        if live is not None and time.monotonic() - last[0] > 0.3:
            last[0] = time.monotonic()
            live.update(pd.DataFrame(samples))

    parts: list[pd.DataFrame] = []
    by_arrival: dict[str, dict[str, Any]] = {a: {} for a in ARRIVALS}
    with db.scratch("noisy-neighbour") as s:
        for policy in k.policies():
            for arrival, got in _drain(s, k, policy, sample).items():
                parts.append(got["waits"])
                by_arrival[arrival][policy] = _stats(policy, got["waits"], got["duplicates"])
            if progress:
                progress(1)
    if live is not None:
        live.update(pd.DataFrame(samples))
    # The policies' own keys hold the first arrival (as before the second one was measured).
    measured: dict[str, Any] = {**by_arrival["during_drain"],
                                "queued_first": by_arrival["queued_first"]}
    measured["small_tenants_p95_lower"] = {
        arrival: {p: round(ratio_of(m["fifo"], m[p]), 1) for p in m if p != "fifo"}
        for arrival, m in by_arrival.items() if "fifo" in m}
    measured = plain(measured)
    verdict = judge(measured, k)
    table = pd.DataFrame([{"arrival": ARRIVALS[a], "policy": p, **m}
                          for a, ms in by_arrival.items() for p, m in ms.items()])
    return Result("noisy-neighbour", k, measured, verdict,
                  table=table, data={"waits": pd.concat(parts, ignore_index=True),
                                     "samples": pd.DataFrame(samples)})


#: The round-robin claim's own parameters (its window, whether it lists every tenant), as the
#: production worker passes them: what is fair's beyond the lease, the batch and the kinds.
ROUND_ROBIN = {k: v for k, v in Leased(None, fair="round-robin").claim_query(1)[1].items()
               if k not in ("lease", "batch", "kinds", "queues")}


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
        # Round-robin: a worker's first claim, which lists every tenant with work (fair.py).
        for name, params in (("claim_leased", {}),
                             ("claim_round_robin", ROUND_ROBIN),
                             ("claim_limit", {"limit": limit})):
            with conn.transaction(force_rollback=True):
                if name == "claim_limit":
                    for _ in range(limit):
                        conn.execute(q("claim_leased"), {"lease": 30, "batch": 1,
                                                         "kinds": ["noop"],
                                                         "queues": ["default"]})
                # A fixed prefix composed with the named query: no value is formatted into SQL.
                explain = sql.SQL("explain (analyze, costs off, timing off, summary off) ")
                rows = conn.execute(explain + sql.SQL(q(name)),  # type: ignore[arg-type]
                                    {"lease": 30, "batch": 1, "kinds": ["noop"], "queues": ["default"],
                                     **params}).fetchall()
            out[name] = "\n".join(r[0] for r in rows)
    return out


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Every job ran once; the order (fair: small tenants before the burst drained, FIFO: after);
    arriving during the drain, each fair policy's small-tenant p95 wait >= 10x lower than FIFO's;
    all queued first, lower than FIFO's (the ratio is reported)."""
    checks = []
    arrivals = {"during_drain": {p: measured[p] for p in POLICIES if p in measured}}
    if measured.get("queued_first"):
        arrivals["queued_first"] = measured["queued_first"]
    for policy in POLICIES:
        runs = {a: ms[policy] for a, ms in arrivals.items() if policy in ms}
        if not runs:
            continue
        checks.append(check(
            f"{policy}: every job ran, once",
            all(m["done"] == m["jobs"] and m["duplicates"] == 0 for m in runs.values()),
            "every job of each arrival, none twice",
            "; ".join(f"{ARRIVALS[a]}: {m['done']} of {m['jobs']}, {m['duplicates']} twice"
                      for a, m in runs.items())))
        order = {a: m.get("small_tenants_before_burst_drained") for a, m in runs.items()}
        if None not in order.values():
            fair = policy != "fifo"
            checks.append(check(
                f"{policy}: small tenants {'before' if fair else 'after'} the burst",
                all(v == fair for v in order.values()),
                "every small tenant's job starts before the burst drained (99 % of it started), "
                "in each arrival"
                if fair else "the small tenants' last job starts after 99 % of the burst "
                "started, in each arrival",
                "; ".join(f"{ARRIVALS[a]}: {'before' if v else 'after'}"
                          for a, v in order.items())))
        if policy == "fifo":
            continue
        for arrival, ms in arrivals.items():
            fifo, m = ms.get("fifo"), ms.get(policy)
            if fifo is None or m is None:
                continue
            ratio, cost = ratio_of(fifo, m), cost_of(fifo, m)
            floor = RATIO if arrival == "during_drain" else 1.0
            checks.append(check(
                f"{policy}, {ARRIVALS[arrival]}: small tenants' p95 wait", ratio >= floor
                if floor > 1 else ratio > floor,
                (f"at least {RATIO:g}x lower than FIFO's {fifo['small_tenants_wait_p95_s']:.3g} s"
                 if floor > 1 else
                 f"lower than FIFO's {fifo['small_tenants_wait_p95_s']:.3g} s (by less: "
                 "each waits its turn in the first round)"),
                f"{m['small_tenants_wait_p95_s']:.3g} s, {ratio:.1f}x lower; "
                f"{m['jobs_per_s']:g} jobs/s vs FIFO {fifo['jobs_per_s']:g} ({cost:+.0%})",
                timing=True))
    return Verdict.of(checks, article=False)


def ratio_of(fifo: dict[str, Any], fair: dict[str, Any]) -> float:
    """Return how many times lower the fair policy's small-tenant p95 wait is than FIFO's."""
    return fifo["small_tenants_wait_p95_s"] / max(fair["small_tenants_wait_p95_s"], 1e-3)


def cost_of(fifo: dict[str, Any], fair: dict[str, Any]) -> float:
    """Return the fair policy's throughput change against FIFO (-0.1 = 10 % fewer jobs/s)."""
    return fair["jobs_per_s"] / fifo["jobs_per_s"] - 1 if fifo["jobs_per_s"] else 0.0
