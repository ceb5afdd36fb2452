"""Exercise ``crash`` (notebook 04): when and how the claim commits, so a crash still counts.

The answer is a worker's whole script: the claim, a ``-- work`` line where the kit runs the
job, and the finish. The finding's queue: a job that kills its worker first (max_attempts 3), a
normal job behind it. Up to six workers start one after the other, each a connection of its own
as the worker role. A worker that takes the crash job dies mid-work: its connection is closed
with whatever transaction it had open, which is what PostgreSQL sees when a worker process
dies (the open transaction rolls back; no error handler runs). The next worker starts once the
lease (0.3 s) has run out.
"""

from __future__ import annotations

import time
from typing import Any

from .. import db
from ..finding import Check, check
from ..queries import q
from ..tenant import TENANT_SETTING
from ._core import (
    LEASED_CLAIM,
    NAIVE_CLAIM,
    Exercise,
    behind_done,
    claim_within_budget,
    fill_queue,
    first_nudge,
    in_transaction,
    refuse_if,
    run_answer,
    split_work,
    worker,
)

WORKERS = 6
MAX_ATTEMPTS = 3
LEASE = 0.3
CRASH, NEXT = 1, 2

_WORK = "-- work: the kit runs the job here (the first job kills its worker)\n"

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
    "After the first crash the job is queued with attempts 0 again. Which transaction was the "
    "count in, and what happened to it when the worker died?",
    "Nothing of a dying worker runs after the crash: no handler, no rollback-then-count. Only "
    "what was committed before the work survives. Commit the claim on its own (no `begin` "
    "before it): in autocommit each statement commits.",
    "Once the count survives, the claim must also stop taking a job whose attempts are spent "
    "(attempts < max_attempts), and not hand a job to a second worker while the first may "
    "still run it: status 'running' and a lease (locked_until), as the view `claimable` knows.",
)


def screen(answer: str) -> None:
    split_work(answer)  # a script without its `-- work` line: one line, before any database
    refuse_if(answer, r"'dead'", "your script marks a job 'dead' itself: after a crash nothing "
              "of the worker runs; the claim has to make the crash count")


def scenario(answer: str, s: db.Scratch) -> tuple[list[Check], str]:
    """Start up to six workers on the crash job's queue, each running the answer's script."""
    claim, finish = split_work(answer)
    m: dict[str, Any] = {"started": 0, "killed": 0, "after_first": None, "refused": None,
                         "left_open": False, "finish_changed": None}
    with s.connect("admin", "exercise crash", autocommit=True) as admin:
        jobs = fill_queue(admin, ((1, "crash", 1), (2, "count", 1)), MAX_ATTEMPTS)
        for n in range(1, WORKERS + 1):
            m["started"] = n
            what = f"worker {n}'s claim"
            with worker(s, f"crash {n}") as conn:
                took = claim_within_budget(conn, claim, {"lease": LEASE}, what)
                if took is None:
                    m["refused"] = n
                    break
                job, attempt = took[0] if took else (None, None)
                if job is not None and jobs.state(job)["kind"] == "crash":
                    m["killed"] += 1
                    conn.close()  # the worker dies mid-work: its open transaction rolls back
                elif job is not None and attempt is not None:
                    _work_and_finish(conn, finish, job, attempt, m)
            jobs.only({j for j, _ in took}, f"worker {n}'s script")
            if m["killed"] == 1 and m["after_first"] is None:
                m["after_first"] = dict(jobs.state(CRASH))
            now = jobs.now()
            if now[NEXT]["status"] == "done" and _settled(now[CRASH]):
                break
            if now[CRASH]["status"] == "running":
                time.sleep(LEASE + 0.05)  # the next worker starts once the lease ran out
        states = jobs.now()
    return judge(m, states[CRASH], states[NEXT])


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


def judge(m: dict[str, Any], crash: dict[str, Any], nxt: dict[str, Any]
          ) -> tuple[list[Check], str]:
    first = m["after_first"] or crash
    counted = first["attempts"] >= 1
    killed_ok = m["killed"] == MAX_ATTEMPTS and not m["refused"]
    if m["refused"]:
        killed_nudge = (f"worker {m['refused']}'s claim took the crash job with its "
                        f"{MAX_ATTEMPTS} attempts spent (the constraint attempts_within_budget "
                        "refused it): after a crash no handler marks the job dead, so the claim "
                        "itself must skip jobs with attempts >= max_attempts")
    else:
        killed_nudge = (f"the crash job killed {m['killed']} of {m['started']} workers; "
                        f"expected {MAX_ATTEMPTS} (max_attempts), then the queue moves on")
    if m["left_open"]:
        next_nudge = ("the job behind it ran, but its finish was never committed: your script "
                      "left a transaction open, and it rolled back when the worker stopped")
    else:
        next_nudge = (f"the job behind it is {nxt['status']}, not done: did a worker claim it "
                      "and did its finish mark it done?")
    pairs: list[tuple[Check, str]] = [
        (check("the first crash counted", counted, "attempts 1 after the first crash",
               f"{first['status']}, attempts {first['attempts']}"),
         f"after the first crash the job was {first['status']} with attempts "
         f"{first['attempts']}: the count was in the dying worker's open transaction and rolled "
         "back with it. Commit the claim before the work."),
        (check("workers the crash job killed", killed_ok,
               f"{MAX_ATTEMPTS}, then it is left alone",
               f"{m['killed']} of {m['started']} started"
               + (f" (worker {m['refused']}'s claim failed)" if m["refused"] else "")),
         killed_nudge),
        behind_done(nxt, next_nudge),
    ]
    return first_nudge(pairs)


EXERCISE = Exercise(
    id="crash", notebook="04", title="a crashing job's attempt counts",
    task="A worker's whole script: the claim (returning id and attempt; %(lease)s is the lease), "
         "a line `-- work` where the kit runs the job, then the finish (%(id)s, %(attempt)s). "
         "Place the transactions so that a worker that dies mid-work still leaves its attempt "
         "counted.",
    starter=STARTER, answer=ANSWER, hints=HINTS, scenario=scenario, screen=screen)
