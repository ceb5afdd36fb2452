"""Finding ``reset``: what cleaning the pooled connection after each job costs, and two traps.

Each variant runs many short jobs (set the tenant, count invoices) through a pool of one
connection and times each job from borrowing to returning, reset function included. Variants:
no cleanup (leaky), the local form (no cleanup needed), RESET + commit, DISCARD ALL with
psycopg's default automatic prepared statements (fails), DISCARD ALL with them off, and RESET
without commit (the pool discards the connection every job).
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import pandas as pd
import psycopg

from .. import db, tenant

CLAIM = ("DISCARD ALL in a pool reset breaks psycopg's prepared statements (fails at job 7); "
         "a reset that leaves a transaction open costs a new connection per job; setting the "
         "tenant locally without cleanup is as cheap as the leaky version.")

ARTICLE: dict[str, Any] = {
    "discard_all_failed_at_job": 7,
    "error": 'prepared statement "_pg3_0" does not exist',
    "connections_opened": {"reset_open_tx": 301},
    "jobs_run": {"reset_open_tx": 300},
    "ms_per_job": {"leaky": 0.33, "local": 0.35, "reset": 0.6, "reset_open_tx": 8.9},
    "sizes": "2,000 jobs per variant, first 200 not counted, run twice; last variant 300 jobs",
}

#: "About as cheap": the local form's median may cost at most this much more than the leaky one.
CHEAP_RATIO = 1.5


@dataclass(frozen=True)
class Variant:
    """One way to run jobs through the pool: how the tenant is set, and what the reset does."""

    name: str
    label: str
    local: bool = False
    reset: tenant.Reset | None = None
    prepare_threshold: int | None = tenant.DEFAULT_PREPARE_THRESHOLD
    trap: str = ""
    churns: bool = False  # opens a connection per job: runs the short size


VARIANTS = (
    Variant("leaky", "no cleanup, session form (leaks)", trap="leaks the tenant"),
    Variant("local", "no cleanup, local form", local=True),
    Variant("reset", "reset: RESET + commit", reset=tenant.reset_idle),
    Variant("discard_all", "reset: DISCARD ALL, prepared statements on", reset=tenant.discard_all,
            trap="prepared statements fail"),
    Variant("discard_all_unprepared", "reset: DISCARD ALL, prepare_threshold=None",
            reset=tenant.discard_all, prepare_threshold=None),
    Variant("reset_open_tx", "reset: RESET without commit", reset=tenant.reset_leaving_transaction,
            trap="new connection every job", churns=True),
)
NAMES = tuple(v.name for v in VARIANTS)


@dataclass(frozen=True)
class Sizes:
    jobs: int
    warmup: int  # first jobs of each run not counted
    runs: int
    churn_jobs: int  # the connection-churning variant runs fewer jobs
    churn_warmup: int


WORKSHOP = Sizes(jobs=600, warmup=100, runs=3, churn_jobs=100, churn_warmup=40)
FULL = Sizes(jobs=2000, warmup=200, runs=2, churn_jobs=300, churn_warmup=200)


def sizes(full: bool = False) -> Sizes:
    return FULL if full else WORKSHOP


def total_jobs(full: bool = False, variants: tuple[Variant, ...] = VARIANTS) -> int:
    """Return how many jobs run() will run: the total for a progress bar."""
    s = sizes(full)
    return s.runs * sum(s.churn_jobs if v.churns else s.jobs for v in variants)


def expected_failure_job(prepare_threshold: int) -> int | None:
    """Return the job at which DISCARD ALL first breaks a prepared statement (None: never).

    psycopg counts executions per query; the one after ``prepare_threshold`` unprepared ones
    (job threshold + 1) prepares it as ``_pg3_N`` (the job's set_config comes first, so it is
    ``_pg3_0``) and the next (job threshold + 2) executes the prepared name, which the reset's
    DISCARD ALL dropped on the server in between. psycopg does notice a DISCARD ALL, but only
    when the statement first enters its cache while something is prepared: with threshold 0
    that is every time (so it never fails), with 5 never (the first DISCARD ALL, after job 1,
    finds nothing prepared yet, and later ones are already in the cache).
    """
    return prepare_threshold + 2 if prepare_threshold >= 1 else None


def _job(conn: psycopg.Connection, job: int, local: bool) -> None:
    tenant_id = job % 100 + 1  # cycle through the tenants: every job a different context
    with conn.transaction() if local else nullcontext():
        tenant.set_tenant(conn, tenant_id, local=local)
        tenant.count_invoices(conn)


def run_variant(scratch: db.Scratch, variant: Variant, jobs: int, *, run: int = 1,
                warmup: int = 0, progress: Callable[[int], None] | None = None
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run `jobs` jobs through a fresh one-connection pool; return per-job rows and pool facts."""
    rows: list[dict[str, Any]] = []
    pool = tenant.one_connection_pool(
        scratch.worker, f"reset {variant.name}", reset=variant.reset,
        prepare_threshold=variant.prepare_threshold)
    with tenant.pool_log() as log, pool:
        pool.wait()
        for job in range(1, jobs + 1):
            error, pid = None, None
            t0 = time.perf_counter()
            try:
                with pool.connection() as conn:
                    pid = conn.info.backend_pid
                    _job(conn, job, variant.local)
            except psycopg.Error as e:  # the DISCARD ALL trap: record it, keep going
                error = f"{type(e).__name__}: {e}"
            ms = (time.perf_counter() - t0) * 1000
            rows.append({"run": run, "variant": variant.name, "job": job, "ms": ms,
                         "counted": job > warmup and error is None, "error": error, "pid": pid})
            if progress and (job % 50 == 0 or job == jobs):
                progress(50 if job % 50 == 0 else job % 50)
        _settle(pool)
        stats = pool.get_stats()
    warnings = [r.getMessage() for r in log if r.levelname == "WARNING"]
    facts = {"run": run, "variant": variant.name, "jobs": jobs,
             "connections_opened": stats.get("connections_num", 0),
             "backends_used": len({r["pid"] for r in rows if r["pid"]}),
             "returns_bad": stats.get("returns_bad", 0), "warnings": warnings}
    return rows, facts


def _settle(pool: Any, timeout: float = 5.0) -> None:
    # A discarded connection is replaced in the background: wait for it so the count is final.
    deadline = time.monotonic() + timeout
    while pool.get_stats().get("pool_available", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)


def run(*, full: bool = False, progress: Callable[[int], None] | None = None,
        variants: tuple[Variant, ...] = VARIANTS, live: Any = None, size: Sizes | None = None
        ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Run every variant `runs` times, interleaved; return per-job rows and the summary."""
    s = size or sizes(full)
    rows: list[dict[str, Any]] = []
    facts: list[dict[str, Any]] = []
    with db.scratch("reset") as scratch:
        for r in range(1, s.runs + 1):
            for v in variants:
                jobs, warmup = (s.churn_jobs, s.churn_warmup) if v.churns else (s.jobs, s.warmup)
                got, fact = run_variant(scratch, v, jobs, run=r, warmup=warmup, progress=progress)
                rows.extend(got)
                facts.append(fact)
                if live is not None:
                    live.update(costs(pd.DataFrame(rows), facts))
    df = pd.DataFrame(rows)
    return df, summarize(df, facts, s)


def costs(df: pd.DataFrame, facts: list[dict[str, Any]]) -> pd.DataFrame:
    """Return one row per variant: median ms per job, ratio to leaky, connections, failures."""
    out = []
    first = {f["variant"]: f for f in reversed(facts)}  # the first run's facts per variant
    for name in pd.unique(df.variant):
        d = df[df.variant == name]
        v = next(v for v in VARIANTS if v.name == name)
        counted = d[d.counted].ms
        failed = d[d.error.notna()]
        out.append({
            "variant": name, "label": v.label, "trap": v.trap,
            "ms_per_job": float(counted.median()) if len(counted) else None,
            "jobs_counted": len(counted), "failed_jobs": len(failed),
            "first_failure": int(failed.job.min()) if len(failed) else None,
            "connections_opened": first[name]["connections_opened"],
            "jobs_run": first[name]["jobs"],
        })
    table = pd.DataFrame(out)
    if "leaky" in set(table.variant):
        leaky = table.loc[table.variant == "leaky", "ms_per_job"].iloc[0]
        table["ratio_to_leaky"] = table.ms_per_job / leaky
    return table


def summarize(df: pd.DataFrame, facts: list[dict[str, Any]], s: Sizes) -> dict[str, Any]:
    """Return the measured values named in the reproduce contract, and a few more."""
    table = costs(df, facts)
    by = table.set_index("variant")
    per_run = {name: [round(statistics.median(g[g.counted].ms), 3) if g.counted.any() else None
                      for _, g in df[df.variant == name].groupby("run")]
               for name in by.index}
    discard = df[(df.variant == "discard_all") & df.error.notna()]
    failures_per_run = [sorted(int(j) for j in g.job) for _, g in discard.groupby("run")]
    first = {f["variant"]: f for f in reversed(facts)}
    warnings = {name: first[name]["warnings"] for name in by.index}
    return {
        "ms_per_job": {n: _round(by.ms_per_job[n], 3) for n in by.index},
        "ratio_to_leaky": {n: _round(by.ratio_to_leaky[n], 2) for n in by.index}
        if "ratio_to_leaky" in by else {},
        "ms_per_job_per_run": per_run,
        "discard_all_failed_at_job": int(discard[discard.run == 1].job.min())
        if (discard.run == 1).any() else None,
        "discard_all_failures_per_run": [f[:6] for f in failures_per_run],
        "discard_all_error": discard.error.iloc[0] if len(discard) else None,
        "discard_all_expected_at_job": expected_failure_job(tenant.DEFAULT_PREPARE_THRESHOLD),
        "discard_all_unprepared_failures": int(
            df[(df.variant == "discard_all_unprepared") & df.error.notna()].shape[0]),
        "connections_opened": {n: int(by.connections_opened[n]) for n in by.index},
        "jobs_run": {n: int(by.jobs_run[n]) for n in by.index},
        "connections_opened_per_run": {
            n: [f["connections_opened"] for f in facts if f["variant"] == n] for n in by.index},
        "pool_warnings": {n: len(w) for n, w in warnings.items()},
        "pool_warning_examples": {n: sorted({_strip_addr(m) for m in w})[:2]
                                  for n, w in warnings.items() if w},
        "sizes": {"jobs": s.jobs, "warmup": s.warmup, "runs": s.runs,
                  "churn_jobs": s.churn_jobs, "churn_warmup": s.churn_warmup},
    }


def _round(x: Any, digits: int) -> float | None:
    return None if x is None or pd.isna(x) else round(float(x), digits)


def _strip_addr(message: str) -> str:
    # "<function f at 0x7f..>" and "<psycopg.Connection [BAD] at 0x7f..>" differ every run.
    return re.sub(r" at 0x[0-9a-f]+", "", message)


def judge(m: dict[str, Any]) -> dict[str, bool]:
    """Return each behaviour the article claims, judged from the measurement (not from ms)."""
    churn_jobs = m["jobs_run"].get("reset_open_tx", 0)
    ratio = m["ratio_to_leaky"]
    return {
        "discard_all_fails": m["discard_all_failed_at_job"] is not None
        and '"_pg3_0" does not exist' in (m["discard_all_error"] or ""),
        "discard_all_unprepared_works": m["discard_all_unprepared_failures"] == 0,
        "open_tx_opens_a_connection_per_job": churn_jobs > 0
        and m["connections_opened"].get("reset_open_tx", 0) >= churn_jobs,
        "open_tx_only_trace_is_a_warning": m["pool_warnings"].get("reset_open_tx", 0) >= churn_jobs,
        "local_about_as_cheap_as_leaky": ratio.get("local") is not None
        and ratio["local"] <= CHEAP_RATIO,
    }


def reproduce(full: bool = False) -> dict[str, Any]:
    """Run the variants and judge the behaviours the article reports."""
    _, m = run(full=full)
    checks = judge(m)
    m["checks"] = checks
    ms, r = m["ms_per_job"], m["ratio_to_leaky"]
    summary = (
        f"DISCARD ALL failed at job {m['discard_all_failed_at_job']}; RESET without commit opened "
        f"{m['connections_opened'].get('reset_open_tx')} connections for "
        f"{m['jobs_run'].get('reset_open_tx')} jobs ({ms.get('reset_open_tx')} ms/job vs "
        f"{ms.get('leaky')} leaky); local {ms.get('local')} ms = {r.get('local')}x leaky"
    )
    return {"measured": m, "reproduced": all(checks.values()), "summary": summary}


def trace_discard_all(prepare_threshold: int | None = tenant.DEFAULT_PREPARE_THRESHOLD,
                      jobs: int = 30) -> dict[str, Any]:
    """Run DISCARD ALL resets with the given prepare_threshold; return where jobs failed and why."""
    variant = Variant("discard_all", f"reset: DISCARD ALL, prepare_threshold={prepare_threshold}",
                      reset=tenant.discard_all, prepare_threshold=prepare_threshold)
    with db.scratch("reset_trace") as scratch:
        rows, facts = run_variant(scratch, variant, jobs)
    failed = [r for r in rows if r["error"]]
    return {
        "prepare_threshold": prepare_threshold, "jobs": jobs,
        "failed_jobs": [r["job"] for r in failed],
        "first_error": failed[0]["error"] if failed else None,
        "expected_first": None if prepare_threshold is None
        else expected_failure_job(prepare_threshold),
        "connections_opened": facts["connections_opened"],
        "reset_errors": sorted({_strip_addr(m) for m in facts["warnings"] if "resetting" in m}),
    }
