"""Finding ``leak``: the tenant context of one job outlives it, but only when the job succeeds.

A pool of exactly one connection (as the worker role) runs one job per tenant 1..n; each job
sets the tenant and counts invoices. After each job a *borrower* takes the connection, sets
nothing, and counts too: whatever it sees is another job's tenant leaking.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import pandas as pd
import psycopg
from psycopg_pool import ConnectionPool

from .. import db, finding, tenant
from ..finding import Result, Verdict, check, knob
from ..queries import q

CLAIM = ("A job that set the tenant in the session form and succeeded hands it to the next "
         "borrower of the pooled connection; a failed job leaks nothing unless in autocommit; "
         "the local form never leaks.")

ARTICLE: dict[str, Any] = {
    "seen_after_job": {
        "session": [20000, 10000, 6666],
        "session_job2_fails": [20000, 20000, 6666],
        "autocommit_job2_fails": [20000, 10000, 6666],
        "local": [0, 0, 0],
    },
    "setup": "pool of one connection, jobs for tenants 1, 2, 3, a borrower after each job",
}

#: Invoices of tenant t in the template database (the article's setup): floor(20000 / t).
INVOICES_OF_TENANT_1 = 20000


class JobFailed(Exception):
    """The experiment's failing job failed, as planned (after it counted ``seen`` invoices)."""

    def __init__(self, message: str, seen: int) -> None:
        super().__init__(message)
        self.seen = seen


@dataclass(frozen=True)
class Variant:
    """One run of the script: how the jobs set the tenant, which job fails, autocommit or not."""

    name: str
    local: bool = False
    fail_job: int | None = None
    autocommit: bool = False

    @property
    def label(self) -> str:
        form = "local form" if self.local else "session form"
        fails = f"job {self.fail_job} fails" if self.fail_job else "all succeed"
        return f"{form}, {fails}{', autocommit' if self.autocommit else ''}"

    @classmethod
    def of(cls, run: str, fail_job: int) -> Variant:
        """Return the variant a run names: words from session/local, autocommit, fails.

        ``fails`` makes job ``fail_job`` fail and becomes ``job<N>_fails`` in the name, so the
        article's runs keep the article's names ("session_job2_fails").
        """
        words = run.split("_")
        if not set(words) <= RUN_WORDS or ("session" in words and "local" in words):
            raise ValueError(f"unknown run {run!r}; combine {', '.join(sorted(RUN_WORDS))} "
                             "(session or local), e.g. 'autocommit_fails' or 'local_fails'")
        fails = "fails" in words
        name = run.replace("fails", f"job{fail_job}_fails") if fails else run
        return cls(name, "local" in words, fail_job if fails else None, "autocommit" in words)


RUN_WORDS = {"session", "local", "autocommit", "fails"}

#: The article's four runs, in the article's order (with fail_job 2 they carry its names).
ARTICLE_RUNS = ("session", "session_fails", "autocommit_fails", "local")


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """Jobs for tenants 1..jobs, one of them failing; the article's setup is already this small."""

    jobs: int = knob(3, lo=1, hi=6, label="jobs (tenants 1..n)")
    fail_job: int = knob(2, lo=1, hi=6, label="failing job")
    runs: tuple[str, ...] = knob(ARTICLE_RUNS)

    def variants(self) -> tuple[Variant, ...]:
        return tuple(Variant.of(r, self.fail_job) for r in self.runs)


#: The article's four runs, in the article's order.
VARIANTS = Knobs().variants()


def _job(conn: psycopg.Connection, tenant_id: int, variant: Variant, fails: bool) -> int:
    # The corrected job wraps its work in a transaction so the local form has one to live in,
    # also in autocommit; the naive job relies on the pool's commit/rollback, as in the article.
    with conn.transaction() if variant.local else nullcontext():
        tenant.set_tenant(conn, tenant_id, local=variant.local)
        seen = tenant.count_invoices(conn)
        if fails:
            try:
                conn.execute(q("tenant_failing_work"))
            except psycopg.errors.DivisionByZero as e:
                raise JobFailed(f"job for tenant {tenant_id} failed: {e}", seen) from e
        return seen


def run_variant(scratch: db.Scratch, variant: Variant, jobs: int = 3) -> list[dict[str, Any]]:
    """Run jobs for tenants 1..jobs, a borrower after each; return one row per step."""
    if jobs < 1 or (variant.fail_job is not None and not 1 <= variant.fail_job <= jobs):
        raise ValueError(f"fail_job must be none or between 1 and {jobs}, not {variant.fail_job}")
    rows: list[dict[str, Any]] = []
    pool: ConnectionPool = tenant.one_connection_pool(
        scratch.worker, f"leak {variant.name}", autocommit=variant.autocommit)
    with pool:
        for job in range(1, jobs + 1):
            fails = job == variant.fail_job
            outcome, seen = "committed", None
            try:
                with pool.connection() as conn:
                    seen = _job(conn, job, variant, fails)
                    if variant.autocommit and not variant.local:
                        outcome = "autocommit"
            except JobFailed as failed:
                seen = failed.seen
                outcome = "failed: rolled back" if not variant.autocommit or variant.local \
                    else "failed: nothing to roll back"
            rows.append(_row(variant, job, "job", job, outcome, seen, job))
            with pool.connection() as conn:  # the borrower: sets nothing
                seen = tenant.count_invoices(conn)
                context = tenant.current_tenant(conn)
            rows.append(_row(variant, job, "borrower", None, "sets nothing", seen, context))
    return rows


def _row(variant: Variant, job: int, actor: str, tenant_id: int | None, outcome: str,
         seen: int | None, context: int | None) -> dict[str, Any]:
    return {"variant": variant.name, "label": variant.label, "job": job, "actor": actor,
            "tenant": tenant_id, "outcome": outcome, "invoices_seen": seen,
            "context": context, "leaked": actor == "borrower" and bool(seen)}


def run(knobs: Knobs | None = None, *, live: Any = None,
        progress: Callable[[int], None] | None = None) -> Result:
    """Run each of the knobs' runs in one scratch database; return the steps and the verdict."""
    k = knobs or Knobs.sized()
    variants = k.variants()  # unknown runs and a failing job past the last fail before any run
    if not 1 <= k.fail_job <= k.jobs:
        raise ValueError(f"the failing job must be between 1 and {k.jobs}, not {k.fail_job}")
    rows: list[dict[str, Any]] = []
    with db.scratch("leak") as s:
        for variant in variants:
            rows.extend(run_variant(s, variant, k.jobs))
            if progress:
                progress(1)
            if live is not None:
                live.update(pd.DataFrame(rows))
    df = pd.DataFrame(rows).astype({"tenant": "Int64", "context": "Int64"})
    seen = seen_after_job(df)
    measured = {
        "seen_after_job": seen,
        "as_article": {v: seen.get(v) == n for v, n in ARTICLE["seen_after_job"].items()},
        "jobs": k.jobs, "fail_job": k.fail_job,
    }
    return Result("leak", k, measured, judge(measured, k), table=df,
                  data={"labels": {v.name: v.label for v in variants}})


def seen_after_job(df: pd.DataFrame) -> dict[str, list[int]]:
    """Return, per variant, the invoices the borrower saw after each job."""
    b = df[df.actor == "borrower"]
    return {v: [int(n) for n in b[b.variant == v].sort_values("job").invoices_seen]
            for v in pd.unique(b.variant)}


def expected_seen(variant: Variant, jobs: int) -> list[int]:
    """Return what the borrower should see after each job: the last committed session tenant.

    A session-form job that succeeds commits its tenant; one that fails rolls it back, unless
    in autocommit, where its set_config committed on its own; the local form ends with its
    transaction. RLS then shows the borrower that tenant's floor(20000 / t) invoices.
    """
    context, out = None, []
    for job in range(1, jobs + 1):
        if not variant.local and (job != variant.fail_job or variant.autocommit):
            context = job
        out.append(INVOICES_OF_TENANT_1 // context if context else 0)
    return out


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Judge each run: the borrower after each job saw what the article (or the model) says.

    At the article's setup the expectation is the article's own numbers; for other knobs it is
    :func:`expected_seen`, which gives the article's numbers at its setup (a test checks that).
    """
    k = knobs or Knobs()
    article = k.is_article_setup()
    checks = []
    for v in k.variants():
        seen = measured["seen_after_job"].get(v.name)
        expected = ARTICLE["seen_after_job"][v.name] if article else expected_seen(v, k.jobs)
        checks.append(check(f"{v.label}: the borrower saw", seen == expected, expected, seen))
    return Verdict.of(checks, article=article)



def script(df: pd.DataFrame, variant: str) -> pd.DataFrame:
    """Return the interleaved script of one variant: who did what, and what it saw."""
    d = df[df.variant == variant]
    lines: list[dict[str, Any]] = []
    for r in d.itertuples():
        if r.actor == "job":
            who = f"job {r.job} (tenant {r.tenant})"
            did = f"sets tenant {r.tenant}, counts, {r.outcome}"
        else:
            who = "borrower"
            did = "sets nothing, counts"
        seen = f"{int(r.invoices_seen):,}"
        note = ""
        if r.actor == "borrower" and r.invoices_seen:
            note = f"LEAK: tenant {int(r.context)}'s invoices"
        lines.append({"step": len(lines) + 1, "who": who, "does": did, "invoices seen": seen,
                      "note": note})
    return pd.DataFrame(lines).set_index("step")
