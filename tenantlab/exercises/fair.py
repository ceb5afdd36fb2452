"""Exercise ``noisy-neighbour`` (notebook 11): a fair claim across tenants.

The finding's queue, small and without timing: tenant 1 enqueues a burst of 30 jobs, then
tenants 2..7 one job each. Three workers (connections as the worker role) claim in rounds: each
runs the answer once, then the three jobs are finished with the fenced ``complete_if_owner``,
until a round claims nothing. What is judged is the order of the claims, never a duration:
the position at which each small tenant's job was claimed.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from .. import db
from ..finding import Check, check
from ..queries import q
from ._core import (
    LEASED_CLAIM,
    Exercise,
    claimed,
    fill_queue,
    first_nudge,
    refuse_final_status,
    run_answer,
    worker,
)

BURST = 30
SMALL = tuple(range(2, 8))
WORKERS = 3
TOTAL = BURST + len(SMALL)
#: A small tenant's job may wait for one round of the tenants with work, plus the claims in flight.
BOUND = 2 * len(SMALL)

STARTER = LEASED_CLAIM

ANSWER = """\
update jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = (select id from claimable
              where tenant_id not in (select tenant_id from jobs
                                       where status = 'running'
                                         and locked_until > clock_timestamp())
              order by claimable_at, id limit 1
              for update skip locked)
returning id, tenant_id, attempts as attempt;
"""

HINTS = (
    "Tenant 1's burst went in first, so a claim that takes the oldest job serves all 30 of its "
    "jobs before anyone else's. Three workers claim at a time: what do they know about the "
    "tenants the other workers are serving right now?",
    "A job that is running (status 'running', lease not expired) says which tenant a worker "
    "serves now. Skip the tenants that already have one running: the other workers serve "
    "everyone else.",
    "Keep the claim's shape (status 'running', attempts + 1, the lease, `returning id, "
    "tenant_id, attempts as attempt`) and add to the choice: `where tenant_id not in (select "
    "tenant_id from jobs where status = 'running' and locked_until > clock_timestamp())`. "
    "Round-robin (the table tenant_turns) works too.",
)


def screen(answer: str) -> None:
    refuse_final_status(answer, "a claim only takes jobs; the fenced finish marks them done")


def scenario(answer: str, s: db.Scratch) -> tuple[list[Check], str]:
    """Drain the burst and the small tenants' jobs with three workers claiming in rounds."""
    order: list[tuple[int, int]] = []  # (job, tenant) per claim, in claim order
    bad_claim: dict[str, Any] | None = None
    twice: int | None = None
    with s.connect("admin", "exercise fair", autocommit=True) as admin, ExitStack() as stack:
        jobs = fill_queue(admin, ((1, "count", BURST), *((t, "count", 1) for t in SMALL)))
        workers = [stack.enter_context(worker(s, f"fair {n}")) for n in range(WORKERS)]
        seen: set[int] = set()
        for _ in range(TOTAL + 1):
            held = []
            for conn in workers:
                what = f"claim {len(order) + 1}"
                params = {"lease": 30, "kinds": ["count"], "batch": 1, "limit": 1,
                          "queues": ["default"]}
                took = claimed(run_answer(conn, answer, params, what), what)
                jobs.only({j for j, _ in took}, what)
                for job, attempt in took:
                    state = jobs.state(job)
                    order.append((job, state["tenant_id"]))
                    if job in seen and twice is None:
                        twice = job
                    seen.add(job)
                    if bad_claim is None and not (state["status"] == "running"
                                                  and state["attempts"] >= 1
                                                  and state["locked_until"] is not None):
                        bad_claim = {"n": len(order), "job": job, **state}
                    held.append((conn, job, attempt))
            if not held:
                break
            for conn, job, attempt in held:
                conn.execute(q("complete_if_owner"), {"id": job, "attempt": attempt,
                                                      "worker": "exercise", "started": None})
            jobs.changed()
        done = sum(1 for j in jobs.now().values() if j["status"] == "done")
        burst_done = sum(1 for j in jobs.now().values()
                         if j["status"] == "done" and j["tenant_id"] == 1)
    return judge(order, bad_claim, twice, done, burst_done)


def judge(order: list[tuple[int, int]], bad: dict[str, Any] | None, twice: int | None,
          done: int, burst_done: int) -> tuple[list[Check], str]:
    positions = {t: next((i + 1 for i, (_, tt) in enumerate(order) if tt == t), None)
                 for t in SMALL}
    got = [p for p in positions.values() if p is not None]
    latest = max(got) if len(got) == len(SMALL) else None
    fair_ok = latest is not None and latest <= BOUND
    if latest is None:
        missing = [t for t, p in positions.items() if p is None]
        fair_nudge = (f"tenant {missing[0]}'s job was never claimed: a fair claim still serves "
                      "every tenant")
    else:
        fair_nudge = (f"the small tenants' jobs were claimed at positions {min(got)} to {latest} "
                      f"of {len(order)}: each waited behind tenant 1's burst of {BURST}. Which "
                      "job would the claim take if it looked at the tenants, not only the ages?")
    if twice is not None:
        all_nudge = f"job {twice} was claimed twice: a claim must not take a job that is running"
    elif burst_done < BURST:
        all_nudge = (f"tenant 1's burst: {burst_done} of {BURST} jobs done. Fair is not "
                     "starving the busy tenant: it must still be served when its turn comes")
    else:
        all_nudge = f"{done} of {TOTAL} jobs done: every job must be claimed and finished once"
    claim_nudge = "" if bad is None else (
        f"claim {bad['n']} took job {bad['job']} and left it {bad['status']} with attempts "
        f"{bad['attempts']}{' and no lease' if bad['locked_until'] is None else ''}: a claim "
        "counts the attempt and sets the lease (status 'running', attempts + 1, locked_until), "
        "as the FIFO claim does")
    pairs: list[tuple[Check, str]] = [
        (check("each claim counted the attempt and set a lease", bad is None,
               "running, attempts 1, lease set",
               "every claim" if bad is None else
               f"claim {bad['n']}: {bad['status']}, attempts {bad['attempts']}"), claim_nudge),
        (check("the small tenants' jobs claimed by", fair_ok,
               f"claim {BOUND} of {TOTAL} at the latest",
               f"claim {latest}" if latest else "never"),
         fair_nudge),
        (check("every job claimed once and done", done == TOTAL and twice is None,
               f"{TOTAL} of {TOTAL}, none twice",
               f"{done} of {TOTAL}" + (f", job {twice} twice" if twice else "")), all_nudge),
    ]
    return first_nudge(pairs)


EXERCISE = Exercise(
    id="noisy-neighbour", notebook="11", title="a fair claim",
    task="The claim three workers run, each in its turn (%(lease)s is the lease in seconds; "
         "%(limit)s = 1 is there if you want it). Tenant 1's burst of 30 jobs went in first; "
         "tenants 2 to 7 have one job each: they must not wait for the whole burst.",
    starter=STARTER, answer=ANSWER, hints=HINTS, scenario=scenario, screen=screen)
