"""Exercise ``poison`` (notebook 03): the claim that counts the attempt.

The finding's queue: the poison job (``select 1/0``) and a normal job, one worker fetching
until the queue settles; three runs vary the budget (max_attempts 3, 2, 4) and whether the poison
job comes first or second. Every claim is judged by the table after it: the jobs it took are
'running', counted once, under a lease; nothing else changed. Each fetch runs the answer (the
claim) as the check's worker role; if the claim left a transaction open (``begin``), the work
runs inside it, as in the single-transaction queue. The work then fails (poison) or counts
invoices; a failure rolls the work's transaction back and the kit's fenced fail
(``fail_if_owner``, no backoff) records it in a new transaction; a success finishes with the
fenced ``complete_if_owner``.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..finding import Check, check
from ..queries import q
from ..tenant import TENANT_SETTING
from ._core import (
    LEASED_CLAIM,
    NAIVE_CLAIM,
    Exercise,
    Jobs,
    admin,
    claim_within_budget,
    fill_queue,
    first_nudge,
    in_transaction,
    over_runs,
    worker,
)
from ._sandbox import Sandbox

#: The runs: (max_attempts, the poison job's position). Varied, so that a claim that hard-codes
#: the budget, or finds the poison job by its place, is seen.
RUNS = ((3, 1), (2, 2), (4, 1))
MAX_ATTEMPTS = 3

STARTER = NAIVE_CLAIM
ANSWER = LEASED_CLAIM

HINTS = (
    "Look at the poison job's attempts after your fetches. The claim did count: so where did "
    "its count go when the work failed?",
    "The claim's `begin` keeps the claim, the work and the failure in one transaction: the "
    "rollback after the failure takes the count with it. A claim that commits on its own, "
    "before the work, keeps it.",
    "The failure is recorded by a fenced statement: `... where id = %(id)s and attempts = "
    "%(attempt)s and status = 'running'`. So the claim must mark the job running (with a lease, "
    "locked_until), count the attempt, and take only jobs that may still run: the view "
    "`claimable` lists them.",
)


def scenario(answer: str, sb: Sandbox) -> tuple[list[Check], str]:
    """The poison job's queue, several times: a budget and a position per run."""
    return over_runs([(f"max_attempts {budget}, the poison job {'first' if pos == 1 else 'second'}",
                       _run(answer, sb, budget, pos)) for budget, pos in RUNS])


def _run(answer: str, sb: Sandbox, budget: int, pos: int) -> tuple[list[Check], str]:
    poison, other = (1, 2) if pos == 1 else (2, 1)
    kinds = ((1, "fail", 1), (2, "count", 1)) if pos == 1 else ((2, "count", 1), (1, "fail", 1))
    fetches = 2 * budget + 4
    m: dict[str, Any] = {"picked": 0, "fetches": 0, "unrecorded": None, "refused": None,
                         "next_fenced": None, "claim": None, "budget": budget, "ran_other": 0}
    with admin(sb, "poison") as conn_admin:
        jobs = fill_queue(conn_admin, kinds, budget)
        with worker(sb, "poison") as conn:
            for fetch in range(1, fetches + 1):
                m["fetches"] = fetch
                what = f"fetch {fetch}'s claim"
                took = claim_within_budget(conn, answer, {"lease": 30, "kinds": ["fail", "count"],
                                                          "batch": 1, "queues": ["default"]},
                                           what)
                if took is None:
                    m["refused"] = fetch
                    break
                problem = jobs.claim(took, what, committed=not in_transaction(conn))
                if problem and m["claim"] is None:
                    m["claim"] = problem
                for job, attempt in took:
                    m["picked"] += job == poison
                    m["ran_other"] += job == other
                    _work(conn, jobs, job, attempt, m)
                if in_transaction(conn):
                    conn.execute("rollback")
                jobs.only({job for job, _ in took}, f"fetch {fetch}'s work and finish")
        now = jobs.now()
    return judge(m, now[poison], now[other])


def _work(conn: psycopg.Connection, jobs: Jobs, job: int, attempt: int,
          m: dict[str, Any]) -> None:
    # The work's transaction: the claim's own when it left one open (single transaction).
    state = jobs.state(job)
    if not in_transaction(conn):
        conn.execute("begin")
    conn.execute(q("tenant_set_local"), {"tenant": str(state["tenant_id"]),
                                          "setting": TENANT_SETTING})
    params = {"id": job, "attempt": attempt, "worker": "exercise", "started": None}
    try:
        if state["kind"] == "fail":
            conn.execute(q("poison"))
        conn.execute(q("count_invoices"))
        finished = conn.execute(q("complete_if_owner"), params).fetchone()
        conn.execute("commit" if finished and finished[0] else "rollback")
        if not (finished and finished[0]):
            m["next_fenced"] = attempt
    except psycopg.errors.DivisionByZero as e:
        conn.execute("rollback")
        row = conn.execute(q("fail_if_owner"), {**params, "error": str(e), "backoff": 0.0,
                                                 "backoff_cap": 0.0}).fetchone()
        if row is None and m["unrecorded"] is None:
            m["unrecorded"] = attempt


def judge(m: dict[str, Any], poison: dict[str, Any], other: dict[str, Any]
          ) -> tuple[list[Check], str]:
    budget = m["budget"]
    picked = f"picked {m['picked']} of {m['fetches']} fetches"
    if m["refused"]:
        poison_nudge = (f"fetch {m['refused']}: your claim took the poison job again with its "
                        f"{budget} attempts spent (the constraint attempts_within_budget "
                        "refused it): the failures were never recorded. Does your claim mark the "
                        "job 'running', as the fenced fail expects?")
    elif poison["attempts"] == 0:
        poison_nudge = (f"the poison job was {picked} and its attempts are still 0: the count "
                        "rolled back with the failed work. Commit the claim before the work.")
    elif m["unrecorded"] is not None:
        poison_nudge = (f"the attempt was counted ({poison['attempts']}), but the failure was not "
                        f"recorded: the fenced fail found no job 'running' with attempt "
                        f"{m['unrecorded']}. Does your claim mark the job running?")
    elif m["picked"] != budget:
        poison_nudge = (f"the poison job ran {m['picked']} times with max_attempts {budget}: "
                        "each attempt is one execution, counted once, until the budget is spent")
    else:
        poison_nudge = (f"the poison job ended {poison['status']} after {poison['attempts']} "
                        f"attempts ({picked}); expected dead after {budget}")
    if m["next_fenced"] is not None:
        next_nudge = (f"the other job ran, but its fenced finish found no job 'running' with "
                      f"attempt {m['next_fenced']}: does your claim mark the job running and "
                      "return the counted attempt?")
    else:
        next_nudge = (f"the poison job is {poison['status']}, but the other job never ran "
                      f"(it is {other['status']}): did your claim ever take it?")
    pairs: list[tuple[Check, str]] = [
        (check("each claim: running, counted once, leased", m["claim"] is None,
               "every job it took", "every job it took" if m["claim"] is None else
               m["claim"].split(":")[0]), m["claim"] or ""),
        (check("the poison job", poison["status"] == "dead" and poison["attempts"] == budget
               and m["picked"] == budget,
               f"dead after {budget} attempts, run {budget} times",
               f"{poison['status']}, attempts {poison['attempts']}, {picked}"), poison_nudge),
        (check("the other job", other["status"] == "done" and m["ran_other"] == 1,
               "done, run once", f"{other['status']}, run {m['ran_other']} times"), next_nudge),
    ]
    return first_nudge(pairs)


EXERCISE = Exercise(
    id="poison", notebook="03", title="the claim that counts the attempt",
    task="The claim a worker runs at each fetch: it returns the job's id and its attempt "
         "(%(lease)s is the lease in seconds). The kit then runs the work (the poison job fails, "
         "always) and records a failure with the fenced fail_if_owner. The check runs the queue "
         "three times, with other budgets (max_attempts) and the poison job first or second.",
    starter=STARTER, answer=ANSWER, hints=HINTS, scenario=scenario)
