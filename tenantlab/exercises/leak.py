"""Exercise ``leak`` (notebook 01): set the tenant so that it cannot reach the next job.

The finding's script, as the check's worker role on one pooled connection (not in autocommit, as the
article's pool): jobs for tenants 1, 2 and 3 each run the answer, then count invoices, and
commit; after each job a borrower takes the same connection, sets nothing, and counts.
"""

from __future__ import annotations

from typing import Any

import psycopg

from .. import db
from ..experiments.leak import INVOICES_OF_TENANT_1
from ..finding import Check, check
from ..queries import q
from ._core import AnswerFailed, Exercise, first_nudge, run_answer, worker
from ._sandbox import Sandbox

TENANTS = (1, 2, 3)

STARTER = """\
select set_config('app.tenant', %(tenant)s, false)
"""

ANSWER = """\
select set_config('app.tenant', %(tenant)s, true)
"""

HINTS = (
    "Read the borrower's row: after job 1 it counted tenant 1's invoices. Something of job 1 "
    "was still on the connection when the job was over.",
    "The job committed. A setting made in the session form survives a commit; one made in the "
    "local form ends with its transaction, commit or rollback.",
    "set_config's third argument is is_local. SET LOCAL app.tenant = %(tenant)s does the same.",
)


def invoices_of(tenant: int | None) -> int:
    return INVOICES_OF_TENANT_1 // tenant if tenant else 0


def scenario(answer: str, s: Sandbox) -> tuple[list[Check], str]:
    """Run the three jobs and their borrowers; judge what each saw."""
    jobs: list[int] = []
    borrowers: list[int] = []
    with worker(s, "leak", autocommit=False) as conn:
        for tenant in TENANTS:
            run_answer(conn, answer, {"tenant": str(tenant)}, f"job {tenant}'s answer")
            jobs.append(_count(conn))
            conn.commit()  # the pool's commit when the job's block ends normally
            borrowers.append(_count(conn))  # the borrower: sets nothing, counts
            conn.commit()
    return judge(jobs, borrowers)


def _count(conn: psycopg.Connection) -> int:
    try:
        return int(db.scalar(conn, q("count_invoices")))
    except psycopg.Error as e:
        raise AnswerFailed(f"counting invoices after your answer failed: {e}".splitlines()[0]) \
            from e


def judge(jobs: list[int], borrowers: list[int]) -> tuple[list[Check], str]:
    """Return the checks and the nudge, from what the jobs and the borrowers saw."""
    expected_jobs = [invoices_of(t) for t in TENANTS]
    wrong = next((i for i, (n, e) in enumerate(zip(jobs, expected_jobs, strict=True)) if n != e),
                 None)
    if wrong is None:
        job_nudge = ""
    elif jobs[wrong] == 0:
        job_nudge = (f"job {TENANTS[wrong]} counted 0 invoices: its tenant was not set for its "
                     "own count. Set it with the job's tenant, %(tenant)s, in the job's "
                     "transaction.")
    else:
        seen = _tenant_of(jobs[wrong])
        job_nudge = (f"job {TENANTS[wrong]} counted {jobs[wrong]:,} invoices, tenant {seen}'s, "
                     f"not its own {expected_jobs[wrong]:,}: does your answer use the job's "
                     "tenant, %(tenant)s?")
    leak = next((i for i, n in enumerate(borrowers) if n), None)
    borrower_nudge = "" if leak is None else (
        f"the borrower after job {TENANTS[leak]} set nothing and still read {borrowers[leak]:,} "
        f"invoices of tenant {_tenant_of(borrowers[leak])}: did the setting outlive its "
        "transaction?")
    pairs: list[tuple[Check, str]] = [
        (check("each job counted its own tenant's invoices", jobs == expected_jobs,
               expected_jobs, jobs), job_nudge),
        (check("the borrower after each job", not any(borrowers), [0] * len(TENANTS),
               borrowers), borrower_nudge),
    ]
    return first_nudge(pairs)


def _tenant_of(n: int) -> Any:
    return next((t for t in range(1, 101) if invoices_of(t) == n), "?")


EXERCISE = Exercise(
    id="leak", notebook="01", title="a tenant setting that cannot leak",
    task="The statement a job runs first, to become its tenant (%(tenant)s is the job's "
         "tenant). The job then counts invoices and commits; the next borrower of the pooled "
         "connection must see nothing.",
    starter=STARTER, answer=ANSWER, hints=HINTS, scenario=scenario)
