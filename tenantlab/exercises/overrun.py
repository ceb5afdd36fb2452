"""Exercise ``overrun`` (notebook 05): the finish only the claimed attempt may make.

The finding's race, step by step and without waiting for a real job: worker A claims the job
(lease 0.3 s, attempt 1) and works past its lease; worker B claims it again (attempt 2, taken
over); then A's late finish runs, then B's. Each finish is the answer, in the work's
transaction, as the worker role; the kit commits it when it says it finished a job (its row
count, or a returned ``finished``) and rolls it back when it says 0, as the worker does.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from .. import db
from ..finding import Check, check
from ..queries import q
from ..tenant import TENANT_SETTING
from ._core import (
    Exercise,
    Jobs,
    Refused,
    claimed,
    fill_queue,
    finished_count,
    first_nudge,
    run_answer,
    worker,
)

LEASE = 0.3
JOB = 1

STARTER = """\
update jobs set status = 'done', locked_until = null, finished = clock_timestamp()
 where id = %(id)s
"""

ANSWER = """\
update jobs set status = 'done', locked_until = null, finished = clock_timestamp()
 where id = %(id)s and attempts = %(attempt)s and status = 'running'
"""

HINTS = (
    "Worker A's finish ran after its lease had run out and worker B had claimed the job again. "
    "What does the row carry now that A's finish could have checked?",
    "The claim counted the attempt: A holds attempt 1, B attempt 2, and the row says 2. A finish "
    "that finishes only its own attempt is fenced: A's matches no row and rolls back.",
    "Put the guard in the WHERE clause: `... and attempts = %(attempt)s and status = 'running'`. "
    "The row count then says whether this attempt still owned the job.",
)


def scenario(answer: str, s: db.Scratch) -> tuple[list[Check], str]:
    """Claim with A, let its lease run out, claim with B, then A's late finish and B's."""
    with s.connect("admin", "exercise overrun", autocommit=True) as admin:
        jobs = fill_queue(admin, ((1, "count", 1),))
        with worker(s, "overrun A") as a, worker(s, "overrun B") as b:
            claim = {"lease": LEASE, "kinds": ["count"], "batch": 1, "queues": ["default"]}
            (_, attempt_a), = claimed(a.execute(q("claim_leased"), claim), "A's claim")
            time.sleep(LEASE + 0.05)  # A works past its lease
            (_, attempt_b), = claimed(b.execute(q("claim_leased"), claim), "B's claim")
            jobs.changed()
            late = _finish(a, answer, attempt_a, "worker A's late finish")
            after_a = jobs.now()[JOB]
            _guard(jobs, attempt_b, "worker A's finish")
            own = _finish(b, answer, attempt_b, "worker B's finish")
            _guard(jobs, attempt_b, "worker B's finish")
        end = jobs.now()[JOB]
    return judge(answer, late, own, after_a, end, attempt_b)


def _finish(conn: psycopg.Connection, answer: str, attempt: int, what: str) -> int:
    conn.execute("begin")
    conn.execute(q("tenant_set_local"), {"tenant": "1", "setting": TENANT_SETTING})
    conn.execute(q("count_invoices"))  # the work
    n = finished_count(run_answer(conn, answer, {"id": JOB, "attempt": attempt,
                                                 "worker": what.split("'")[0],
                                                 "started": None}, what))
    conn.execute("commit" if n else "rollback")
    return n


def _guard(jobs: Jobs, attempt: int, what: str) -> None:
    jobs.only({JOB}, what)
    if jobs.state(JOB)["attempts"] != attempt:
        raise Refused(f"{what} changed the job's attempts: the count belongs to the claim; "
                      "a finish that rewrites it erases the evidence the fence reads")


def judge(answer: str, late: int, own: int, after_a: dict[str, Any], end: dict[str, Any],
          attempt_b: int) -> tuple[list[Check], str]:
    wrote = late > 0
    if "locked_until" in answer.lower().split("where", 1)[-1]:
        late_nudge = (f"worker A's finish, after its lease had run out, still finished the job "
                      f"while worker B ran attempt {attempt_b}: the lease your finish checked is "
                      "B's now (B's claim set a new one). Guard on what only A's attempt has.")
    else:
        late_nudge = (f"worker A's finish, after its lease had run out, marked the job "
                      f"{after_a['status']} while worker B ran attempt {attempt_b}: guard the "
                      "finish on the attempt it claimed (%(attempt)s)")
    pairs: list[tuple[Check, str]] = [
        (check("worker A's late finish (attempt 1)", not wrote,
               "0 jobs finished: fenced, rolled back",
               f"{late} job{'s' if late != 1 else ''} finished"
               + (f", the job {after_a['status']} while B ran attempt {attempt_b}" if wrote
                  else "")), late_nudge),
        (check(f"worker B's finish (attempt {attempt_b})", own == 1, "1 job finished",
               f"{own} job{'s' if own != 1 else ''} finished"),
         f"worker B owns attempt {attempt_b}, and its finish matched {own} jobs: the guard must "
         "let the attempt that owns the job through (status 'running', attempts = %(attempt)s)"),
        (check("the job at the end", end["status"] == "done" and end["attempts"] == attempt_b,
               f"done, attempts {attempt_b}", f"{end['status']}, attempts {end['attempts']}"),
         f"after both finishes the job is {end['status']}: the finish must set status = 'done'"),
    ]
    return first_nudge(pairs)


EXERCISE = Exercise(
    id="overrun", notebook="05", title="the fenced finish",
    task="The finish a worker runs as the last statement of the work's transaction: %(id)s is "
         "the job, %(attempt)s the attempt this worker claimed. It must say how many jobs it "
         "finished (its row count): 0 means fenced, and the worker rolls back.",
    starter=STARTER, answer=ANSWER, hints=HINTS, scenario=scenario)
