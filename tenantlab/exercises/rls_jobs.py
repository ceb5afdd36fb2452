"""Exercise ``rls-jobs`` (notebook 08): the claim sees the jobs again, without BYPASSRLS.

The finding's trap: the invoices' tenant policy on the jobs table too, 20 jobs for tenants
1..20. The answer is a migration of the jobs table's row security: only the table's owner may
change a policy, so it runs on a login of its own as the owner of the scratch database's jobs
table (a role made for the check: not superuser, no BYPASSRLS, owner of nothing else, member of
no role). What it may do follows from those rights, not from its words: a statement on another
table, a role or the server is refused by PostgreSQL. Then the production claim runs as the
check's worker role with no tenant context (a policy written ``to tenantlab_worker`` applies to
it, as it stands in for that role), and each job it takes counts its tenant's invoices.
"""

from __future__ import annotations

from typing import Any

from .. import db
from ..finding import Check, check
from ..queries import q
from ..tenant import TENANT_SETTING
from ._core import Exercise, admin, first_nudge, in_transaction, run_answer, worker
from ._sandbox import Sandbox, adopt_worker_policies

JOBS = 20

STARTER = """\
alter table jobs enable row level security;
alter table jobs force row level security;
"""

ANSWER = """\
drop policy tenant_isolation on jobs;
alter table jobs no force row level security;
alter table jobs disable row level security;
"""

HINTS = (
    "Look at how many jobs the worker saw, and whether its claim returned an error: a policy is "
    "a filter, not a refusal. It compares each job's tenant with app.tenant, which the worker "
    "sets only inside a job, after the claim.",
    "The answer is a migration, run by the table's owner. NO FORCE exempts only the owner; the "
    "worker is not the owner. And row security on with no policy left hides every row.",
    "Take the jobs table out of the tenant policy: drop the policy and disable row level "
    "security on jobs (the kit's schema has none). Or, keeping it, add a policy for the worker "
    "role that lets it read and update every job: a claim locks and updates, so FOR SELECT is "
    "not enough.",
)

def scenario(answer: str, sb: Sandbox) -> tuple[list[Check], str]:
    """Put the policy on jobs, run the migration as the jobs table's owner, then claim."""
    with admin(sb, "rls-jobs") as conn_admin:
        conn_admin.execute(q("enqueue_demo"), {"tenant": None, "kind": "count", "seconds": 0.0,
                                               "count": JOBS, "max_attempts": 3, "write": False})
        conn_admin.execute(q("jobs_tenant_policy"))
    # The migration: on a login of its own as the table's owner (a role made for the check,
    # which owns nothing else), committed as a migration tool would.
    with worker(sb, "rls-jobs migration", autocommit=False, role="owner") as owner:
        run_answer(owner, answer, {}, "your migration")
        if in_transaction(owner):
            owner.commit()
    with admin(sb, "rls-jobs") as conn_admin:
        # A policy written `to tenantlab_worker` names the role the check's worker stands in for.
        adopt_worker_policies(conn_admin, sb)
        table = conn_admin.execute(q("exercise_jobs_rls")).fetchone() or (False, False, 0, 0)
    counts: dict[int, int] = {}
    with worker(sb, "rls-jobs") as conn:
        visible = int(db.scalar(conn, q("count_jobs")))
        for _ in range(JOBS + 2):
            params = {"lease": 30, "kinds": ["count"], "batch": 1, "queues": ["default"]}
            row = conn.execute(q("claim_leased"), params).fetchone()
            if row is None:
                break
            job, tenant, attempt = row[0], row[1], row[2]
            with conn.transaction():
                conn.execute(q("start_if_owner"), {"id": job, "attempt": attempt,
                                                   "tenant": str(tenant),
                                                   "setting": TENANT_SETTING})
                counts[tenant] = int(db.scalar(conn, q("count_invoices")))
                conn.execute(q("complete_if_owner"), {"id": job, "attempt": attempt,
                                                      "worker": "exercise", "started": None})
    return judge(visible, counts, *table)


def judge(visible: int, counts: dict[Any, int], enabled: bool, forced: bool, policies: int,
          select_only: int) -> tuple[list[Check], str]:
    if visible:
        see_nudge = f"the worker sees {visible} of {JOBS} jobs: some are still hidden"
    elif enabled and not policies:
        see_nudge = ("the worker still sees 0 of 20 jobs: row level security is on and no policy "
                     "is left, and then PostgreSQL hides every row (default deny)")
    elif enabled and not forced:
        see_nudge = ("the worker still sees 0 of 20 jobs: NO FORCE exempts only the table's "
                     "owner, and the worker is not the owner")
    else:
        see_nudge = ("the worker, without tenant context, still sees 0 of 20 jobs and no error: "
                     "the policy still hides the queue")
    claim_nudge = (f"the worker sees {visible} jobs but its claim took {len(counts)}, without an "
                   "error: a claim locks and updates its job (FOR UPDATE, UPDATE)"
                   + (", and a policy FOR SELECT lets the worker only read" if select_only
                      else ": does a policy let the worker update them?"))
    expected = {t: 20000 // t for t in range(1, JOBS + 1)}
    wrong = next((t for t in sorted(counts, key=str) if counts[t] != expected.get(t)), None)
    pairs: list[tuple[Check, str]] = [
        (check("jobs the worker sees, no tenant set", visible == JOBS, f"{JOBS} of {JOBS}",
               f"{visible} of {JOBS}"), see_nudge),
        (check("jobs its claim took and finished", len(counts) == JOBS, f"{JOBS} of {JOBS}",
               f"{len(counts)} of {JOBS}"), claim_nudge),
        (check("each job counted only its tenant's invoices", counts == expected,
               "floor(20000 / tenant) each",
               "each as expected" if counts == expected else "no job ran" if not counts else
               f"tenant {wrong}: {counts.get(wrong)}"),
         f"the job of tenant {wrong} counted {counts.get(wrong)} invoices: the invoices' policy "
         "must still apply to the work"),
    ]
    return first_nudge(pairs)


EXERCISE = Exercise(
    id="rls-jobs", notebook="08", title="the claim under RLS, without BYPASSRLS",
    task="A migration of the jobs table's row security, run by the table's owner (a role that "
         "owns the jobs table and nothing else). Afterwards the worker, with no tenant context, "
         "must claim every job, and each job must still see only its tenant's invoices.",
    starter=STARTER, answer=ANSWER, hints=HINTS, scenario=scenario, owner=True,
    may_change=("policy jobs ", "row security jobs:"))
