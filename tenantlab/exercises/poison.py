"""Exercise ``poison`` (notebook 03): the claim that counts the attempt.

The finding's queue: the poison job (``select 1/0``) first, a normal job behind it, max_attempts
3, one worker fetching ten times. Each fetch runs the answer (the claim) as the worker role; if
the claim left a transaction open (``begin``), the work runs inside it, as in the
single-transaction queue. The work then fails (poison) or counts invoices; a failure rolls the
work's transaction back and the kit's fenced fail (``fail_if_owner``, no backoff) records it in a
new transaction; a success finishes with the fenced ``complete_if_owner``.
"""

from __future__ import annotations

from typing import Any

import psycopg

from .. import db
from ..finding import Check, check
from ..queries import q
from ..tenant import TENANT_SETTING
from ._core import (
    LEASED_CLAIM,
    NAIVE_CLAIM,
    Exercise,
    Jobs,
    behind_done,
    claim_within_budget,
    fill_queue,
    first_nudge,
    in_transaction,
    refuse_final_status,
    worker,
)

FETCHES = 10
MAX_ATTEMPTS = 3
POISON, NEXT = 1, 2

STARTER = NAIVE_CLAIM
ANSWER = LEASED_CLAIM

HINTS = (
    "Look at attempts after ten fetches: 0. The claim did count, so where did its count go?",
    "The claim's `begin` keeps the claim, the work and the failure in one transaction: the "
    "rollback after the failure takes the count with it. A claim that commits on its own, "
    "before the work, keeps it.",
    "The failure is recorded by a fenced statement: `... where id = %(id)s and attempts = "
    "%(attempt)s and status = 'running'`. So the claim must mark the job running (with a lease, "
    "locked_until), count the attempt, and take only jobs that may still run: the view "
    "`claimable` lists them.",
)


def screen(answer: str) -> None:
    refuse_final_status(answer, "the claim only takes a job; what happens after a failure is "
                        "the fenced fail's job")


def scenario(answer: str, s: db.Scratch) -> tuple[list[Check], str]:
    """Ten fetches of the poison job's queue with the answer as the claim."""
    m: dict[str, Any] = {"picked": 0, "fetches": 0, "unrecorded": None, "refused": None,
                         "next_fenced": None}
    with s.connect("admin", "exercise poison", autocommit=True) as admin:
        jobs = fill_queue(admin, ((1, "fail", 1), (2, "count", 1)), MAX_ATTEMPTS)
        with worker(s, "poison") as conn:
            for fetch in range(1, FETCHES + 1):
                m["fetches"] = fetch
                what = f"fetch {fetch}'s claim"
                took = claim_within_budget(conn, answer, {"lease": 30, "kinds": ["fail", "count"],
                                                          "batch": 1, "queues": ["default"]},
                                           what)
                if took is None:
                    m["refused"] = fetch
                    break
                for job, attempt in took:
                    m["picked"] += job == POISON
                    _work(conn, jobs, job, attempt, m)
                if in_transaction(conn):
                    conn.execute("rollback")
                jobs.only({job for job, _ in took}, what)
        now = jobs.now()
        states = {j: now[j] for j in (POISON, NEXT)}
    return judge(m, states)


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


def judge(m: dict[str, Any], states: dict[int, dict[str, Any]]) -> tuple[list[Check], str]:
    poison, nxt = states[POISON], states[NEXT]
    picked = f"picked {m['picked']} of {m['fetches']} fetches"
    if m["refused"]:
        poison_nudge = (f"fetch {m['refused']}: your claim took the poison job again with its "
                        f"{MAX_ATTEMPTS} attempts spent (the constraint attempts_within_budget "
                        "refused it): the failures were never recorded. Does your claim mark the "
                        "job 'running', as the fenced fail expects?")
    elif poison["attempts"] == 0:
        poison_nudge = (f"the poison job was {picked} and its attempts are still 0: the count "
                        "rolled back with the failed work. Commit the claim before the work.")
    elif m["unrecorded"] is not None:
        poison_nudge = (f"the attempt was counted ({poison['attempts']}), but the failure was not "
                        f"recorded: the fenced fail found no job 'running' with attempt "
                        f"{m['unrecorded']}. Does your claim mark the job running?")
    else:
        poison_nudge = (f"the poison job ended {poison['status']} after {poison['attempts']} "
                        f"attempts ({picked}); expected dead after {MAX_ATTEMPTS}")
    if m["next_fenced"] is not None:
        next_nudge = (f"the job behind it ran, but its fenced finish found no job 'running' with "
                      f"attempt {m['next_fenced']}: does your claim mark the job running and "
                      "return the counted attempt?")
    else:
        next_nudge = (f"the poison job is {poison['status']}, but the job behind it never ran "
                      f"(it is {nxt['status']}): did your claim ever take it?")
    pairs: list[tuple[Check, str]] = [
        (check("the poison job", poison["status"] == "dead"
               and poison["attempts"] == MAX_ATTEMPTS,
               f"dead after {MAX_ATTEMPTS} attempts",
               f"{poison['status']}, attempts {poison['attempts']}, {picked}"), poison_nudge),
        behind_done(nxt, next_nudge),
    ]
    return first_nudge(pairs)


EXERCISE = Exercise(
    id="poison", notebook="03", title="the claim that counts the attempt",
    task="The claim a worker runs at each fetch: it returns the job's id and its attempt "
         "(%(lease)s is the lease in seconds). The kit then runs the work (the first job fails, "
         "always) and records a failure with the fenced fail_if_owner.",
    starter=STARTER, answer=ANSWER, hints=HINTS, scenario=scenario, screen=screen)
