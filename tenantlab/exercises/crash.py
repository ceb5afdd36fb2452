"""Exercise ``crash`` (notebook 04): when and how the claim commits, so a crash still counts.

The answer is a worker's whole script: the claim, a ``-- work`` line where the kit runs the
job, and the finish. The finding's queue: a job that kills its worker and a normal job, in two
runs that vary the budget (3, 2) and which comes first. Workers start one after the other, each
a connection of its own as the check's worker role. A worker that takes the crash job dies
mid-work: its connection is closed with whatever transaction it had open, which is what
PostgreSQL sees when a worker process dies (the open transaction rolls back; no error handler
runs). The next worker starts once the lease has run out (the kit moves it into the past: no
waiting). Every claim is judged by the table after it: the jobs it took are 'running',
counted once, under a lease.
"""

from __future__ import annotations

from typing import Any

from ..finding import Check, check
from ..queries import q
from ..tenant import TENANT_SETTING
from ._core import (
    LEASED_CLAIM,
    NAIVE_CLAIM,
    Exercise,
    admin,
    claim_within_budget,
    fill_queue,
    first_nudge,
    in_transaction,
    over_runs,
    run_answer,
    split_work,
    worker,
)
from ._sandbox import Sandbox

#: The runs: (max_attempts, the crash job's position). Varied, so that a claim that hard-codes
#: the budget, or finds the crash job by its place, is seen.
RUNS = ((3, 1), (2, 2))
MAX_ATTEMPTS = 3
LEASE = 30

_WORK = "-- work: the kit runs the job here (the crash job kills its worker)\n"

STARTER = NAIVE_CLAIM + _WORK + """\
update jobs set status = 'done', finished = clock_timestamp()
 where id = %(id)s;
commit;
"""

ANSWER = LEASED_CLAIM + _WORK + """\
update jobs set status = 'done', locked_until = null, finished = clock_timestamp()
 where id = %(id)s and attempts = %(attempt)s and status = 'running';
"""

HINTS = (
    "Look at the crash job right after the first crash: its status and its attempts. Which "
    "transaction was the count in, and what happened to it when the worker died?",
    "Nothing of a dying worker runs after the crash: no handler, no rollback-then-count. Only "
    "what was committed before the work survives. Commit the claim on its own (no `begin` "
    "before it): in autocommit each statement commits.",
    "Once the count survives, the claim must also stop taking a job whose attempts are spent "
    "(attempts < max_attempts), and not hand a job to a second worker while the first may "
    "still run it: status 'running' and a lease (locked_until), as the view `claimable` knows.",
)


def screen(answer: str) -> None:
    split_work(answer)  # a script without its `-- work` line: one line, before any database


def scenario(answer: str, sb: Sandbox) -> tuple[list[Check], str]:
    """Start workers one after the other on the crash job's queue, in each run."""
    return over_runs([(f"max_attempts {budget}, the crash job {'first' if pos == 1 else 'second'}",
                       _run(answer, sb, budget, pos)) for budget, pos in RUNS])


def _run(answer: str, sb: Sandbox, budget: int, pos: int) -> tuple[list[Check], str]:
    claim, finish = split_work(answer)
    crash, other = (1, 2) if pos == 1 else (2, 1)
    kinds = ((1, "crash", 1), (2, "count", 1)) if pos == 1 else ((2, "count", 1), (1, "crash", 1))
    m: dict[str, Any] = {"started": 0, "killed": 0, "after_first": None, "refused": None,
                         "left_open": False, "claim": None, "budget": budget, "ran_other": 0,
                         "after_settled": False}
    with admin(sb, "crash") as conn_admin:
        jobs = fill_queue(conn_admin, kinds, budget)
        for n in range(1, budget + 6):
            m["started"] = n
            what = f"worker {n}'s claim"
            with worker(sb, f"crash {n}") as conn:
                took = claim_within_budget(conn, claim, {"lease": LEASE}, what)
                if took is None:
                    m["refused"] = n
                    break
                problem = jobs.claim(took, what, committed=not in_transaction(conn))
                if problem and m["claim"] is None:
                    m["claim"] = problem
                job, attempt = took[0] if took else (None, None)
                if job is not None and jobs.state(job)["kind"] == "crash":
                    m["killed"] += 1
                    conn.close()  # the worker dies mid-work: its open transaction rolls back
                elif job is not None and attempt is not None:
                    m["ran_other"] += 1
                    _work_and_finish(conn, finish, job, attempt, m)
            jobs.only({j for j, _ in took}, f"worker {n}'s script")
            if m["killed"] == 1 and m["after_first"] is None:
                m["after_first"] = dict(jobs.state(crash))
            now = jobs.now()
            if now[other]["status"] == "done" and _settled(now[crash]):
                if m["after_settled"]:
                    break
                # One more worker once all is settled: its claim must leave the spent job alone.
                m["after_settled"] = True
            jobs.expire()  # time passes: the dead worker's lease runs out before the next starts
        states = jobs.now()
    return judge(m, states[crash], states[other])


def _settled(job: dict[str, Any]) -> bool:
    return job["status"] in ("done", "dead") or job["attempts"] >= job["max_attempts"]


def _work_and_finish(conn: Any, finish: str, job: int, attempt: int,
                     m: dict[str, Any]) -> None:
    opened = in_transaction(conn)
    if not opened:
        conn.execute("begin")
    conn.execute(q("tenant_set_local"), {"tenant": "2", "setting": TENANT_SETTING})
    conn.execute(q("count_invoices"))
    if not opened:
        conn.execute("commit")
    run_answer(conn, finish, {"id": job, "attempt": attempt, "lease": LEASE},
               f"the finish of job {job}")
    # The worker goes away after its job: a transaction still open rolls back now.
    m["left_open"] = in_transaction(conn)


def judge(m: dict[str, Any], crash: dict[str, Any], other: dict[str, Any]
          ) -> tuple[list[Check], str]:
    budget = m["budget"]
    first = m["after_first"] or crash
    counted = first["attempts"] >= 1
    killed_ok = m["killed"] == budget and not m["refused"]
    if m["refused"]:
        killed_nudge = (f"worker {m['refused']}'s claim took the crash job with its "
                        f"{budget} attempts spent (the constraint attempts_within_budget "
                        "refused it): after a crash no handler marks the job dead, so the claim "
                        "itself must skip jobs with attempts >= max_attempts")
    else:
        killed_nudge = (f"the crash job killed {m['killed']} of {m['started']} workers; "
                        f"expected {budget} (max_attempts), then the queue moves on")
    if m["left_open"]:
        next_nudge = ("the other job ran, but its finish was never committed: your script "
                      "left a transaction open, and it rolled back when the worker stopped")
    else:
        next_nudge = (f"the other job is {other['status']} after {m['ran_other']} runs, not done "
                      "once: did a worker claim it and did its finish mark it done?")
    pairs: list[tuple[Check, str]] = [
        (check("the first crash counted", counted, "attempts 1 after the first crash",
               f"{first['status']}, attempts {first['attempts']}"),
         f"after the first crash the job was {first['status']} with attempts "
         f"{first['attempts']}: the count was in the dying worker's open transaction and rolled "
         "back with it. Commit the claim before the work."),
        (check("each claim: running, counted once, leased", m["claim"] is None,
               "every job it took", "every job it took" if m["claim"] is None else
               m["claim"].split(":")[0]), m["claim"] or ""),
        (check("workers the crash job killed", killed_ok,
               f"{budget}, then it is left alone",
               f"{m['killed']} of {m['started']} started"
               + (f" (worker {m['refused']}'s claim failed)" if m["refused"] else "")),
         killed_nudge),
        (check("the other job", other["status"] == "done" and m["ran_other"] == 1,
               "done, run once", f"{other['status']}, run {m['ran_other']} times"), next_nudge),
    ]
    return first_nudge(pairs)


EXERCISE = Exercise(
    id="crash", notebook="04", title="a crashing job's attempt counts",
    task="A worker's whole script: the claim (returning id and attempt; %(lease)s is the lease), "
         "a line `-- work` where the kit runs the job, then the finish (%(id)s, %(attempt)s). "
         "Place the transactions so that a worker that dies mid-work still leaves its attempt "
         "counted. The check runs twice, with budgets 3 and 2 and the crash job first or "
         "second.",
    starter=STARTER, answer=ANSWER, hints=HINTS, scenario=scenario, screen=screen)
