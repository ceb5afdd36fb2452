"""Exercise ``overrun`` (notebook 05): the finish only the claimed attempt may make.

The finding's race, step by step and without waiting for a real job: worker A claims the job
and works past its lease (the kit moves the lease into the past); worker B claims it again
(taken over); then A's late finish runs, then B's. Each finish is the answer, in the work's
transaction, as the check's worker role; the kit commits it when it says it finished a job (its
row count, or a returned ``finished``) and rolls it back when it says 0, as the worker does.
The judge reads the job's state after each finish, never that count. Three runs vary the job
and its attempts before the race, and the last has no takeover: A's finish must finish it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..finding import Check, check
from ..queries import q
from ..tenant import TENANT_SETTING
from ._core import (
    Exercise,
    Jobs,
    Refused,
    admin,
    claimed,
    fill_queue,
    finished_count,
    first_nudge,
    in_transaction,
    over_runs,
    run_answer,
    worker,
)
from ._sandbox import Sandbox

LEASE = 30

#: The runs: (the job's id, its attempts before the race, whether B takes over). Varied, so that
#: a finish that hard-codes an attempt number, or a job, is seen; the last run has no takeover:
#: A's finish, in time, must finish the job.
RUNS = ((1, 0, True), (2, 3, True), (3, 5, False))
MAX_ATTEMPTS = 9

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
    "The claim counted the attempt: A holds one attempt, B the next, and the row says B's. A "
    "finish that finishes only its own attempt is fenced: A's matches no row and rolls back.",
    "Put the guard in the WHERE clause: `... and attempts = %(attempt)s and status = 'running'`. "
    "The row count then says whether this attempt still owned the job.",
)


def scenario(answer: str, sb: Sandbox) -> tuple[list[Check], str]:
    """The race in three runs: other jobs, other attempt numbers, and once no takeover."""
    return over_runs([(f"job {job}, attempts {before} before"
                       + ("" if takeover else ", no takeover: A finishes in time"),
                       _run(answer, sb, job, before, takeover))
                      for job, before, takeover in RUNS])


def _run(answer: str, sb: Sandbox, job: int, before: int, takeover: bool
         ) -> tuple[list[Check], str]:
    with admin(sb, "overrun") as conn_admin:
        jobs = fill_queue(conn_admin, ((1, "count", 3),), MAX_ATTEMPTS)
        conn_admin.execute(q("exercise_set_attempts"), {"id": job, "attempts": before,
                                                        "max_attempts": MAX_ATTEMPTS})
        # Only this run's job may be claimed: the others wait (they are not due yet).
        conn_admin.execute(q("exercise_hold_others"), {"id": job})
        jobs.changed()
        with worker(sb, "overrun A") as a, worker(sb, "overrun B") as b:
            claim = {"lease": LEASE, "kinds": ["count"], "batch": 1, "queues": ["default"]}
            (_, attempt_a), = claimed(a.execute(q("claim_leased"), claim), "A's claim")
            attempt_b = attempt_a
            if takeover:
                jobs.expire()  # A works past its lease
                (_, attempt_b), = claimed(b.execute(q("claim_leased"), claim), "B's claim")
            jobs.changed()
            late = _finish(a, answer, job, attempt_a, "worker A's finish")
            after_a = jobs.now()[job]
            _guard(jobs, job, attempt_b, "worker A's finish")
            own = 0
            if takeover:
                own = _finish(b, answer, job, attempt_b, "worker B's finish")
                _guard(jobs, job, attempt_b, "worker B's finish")
        end = jobs.now()[job]
    return judge(answer, late, own, after_a, end, attempt_a, attempt_b, takeover)


def _finish(conn: psycopg.Connection, answer: str, job: int, attempt: int, what: str) -> int:
    conn.execute("begin")
    conn.execute(q("tenant_set_local"), {"tenant": "1", "setting": TENANT_SETTING})
    conn.execute(q("count_invoices"))  # the work
    n = finished_count(run_answer(conn, answer, {"id": job, "attempt": attempt,
                                                 "worker": what.split("'")[0],
                                                 "started": None}, what), what)
    # As the worker does: commit when the finish says it finished, else roll back. The judge
    # reads the job's state afterwards, never this count.
    if in_transaction(conn):
        conn.execute("commit" if n else "rollback")
    return n


def _guard(jobs: Jobs, job: int, attempt: int, what: str) -> None:
    jobs.only({job}, what)
    if jobs.state(job)["attempts"] != attempt:
        raise Refused(f"{what} changed the job's attempts: the count belongs to the claim; "
                      "a finish that rewrites it erases the evidence the fence reads")


def judge(answer: str, late: int, own: int, after_a: dict[str, Any], end: dict[str, Any],
          attempt_a: int, attempt_b: int, takeover: bool) -> tuple[list[Check], str]:
    if not takeover:
        ok = end["status"] == "done" and end["attempts"] == attempt_a
        pairs: list[tuple[Check, str]] = [
            (check("a finish in time, no takeover", ok,
                   f"done, attempts {attempt_a}", f"{end['status']}, attempts {end['attempts']}"),
             f"worker A still owned attempt {attempt_a} and finished in time, but the job is "
             f"{end['status']}: the guard must let the attempt that owns the job through "
             "(status 'running', attempts = %(attempt)s)")]
        return first_nudge(pairs)
    # Judged by the table: after A's late finish the job must still be B's, running.
    wrote = not (after_a["status"] == "running" and after_a["attempts"] == attempt_b)
    if "locked_until" in answer.lower().split("where", 1)[-1]:
        late_nudge = (f"worker A's finish, after its lease had run out, still finished the job "
                      f"while worker B ran attempt {attempt_b}: the lease your finish checked is "
                      "B's now (B's claim set a new one). Guard on what only A's attempt has.")
    else:
        late_nudge = (f"worker A's finish, after its lease had run out, marked the job "
                      f"{after_a['status']} while worker B ran attempt {attempt_b}: guard the "
                      "finish on the attempt it claimed (%(attempt)s)")
    done = end["status"] == "done" and end["attempts"] == attempt_b
    pairs = [
        (check("worker A's late finish", not wrote,
               "fenced: the job still B's, running",
               f"attempt {attempt_a}: the job {after_a['status']}"
               + (" (fenced)" if not wrote else f" while B ran attempt {attempt_b}")),
         late_nudge),
        (check("worker B's finish", done,
               f"done, attempts {attempt_b}", f"{end['status']}, attempts {end['attempts']}"
               + (f"; it said it finished {own}" if own and not done else "")),
         f"worker B owns attempt {attempt_b}, and after its finish the job is {end['status']}: "
         "the guard must let the attempt that owns the job through (status 'running', "
         "attempts = %(attempt)s), and the finish must set status = 'done'"),
    ]
    return first_nudge(pairs)


EXERCISE = Exercise(
    id="overrun", notebook="05", title="the fenced finish",
    task="The finish a worker runs as the last statement of the work's transaction: %(id)s is "
         "the job, %(attempt)s the attempt this worker claimed. It must say how many jobs it "
         "finished (its row count): 0 means fenced, and the worker rolls back. The check runs "
         "the race three times, with other jobs and attempt numbers, once without a takeover; "
         "it judges by the job's state, not by the count your finish returns.",
    starter=STARTER, answer=ANSWER, hints=HINTS, scenario=scenario)
