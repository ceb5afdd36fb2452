"""Exercise ``noisy-neighbour`` (notebook 11): a fair claim across tenants.

The finding's queue, small and without timing: a noisy tenant enqueues a burst of 30 jobs, then
the small tenants one job each; three runs make the noisy tenant the lowest id (1, then 2..7),
the highest (9, then 1..6) and one between (4, then 1, 2, 5, 6), so a claim that favours ids is
seen. Three workers (connections as the check's worker role) claim in rounds: each
runs the answer once, then the three jobs are finished with the fenced ``complete_if_owner``,
until a round claims nothing. What is judged is the order of the claims, never a duration:
the position at which each small tenant's job was claimed.
"""

from __future__ import annotations

from contextlib import ExitStack

from ..finding import Check, check
from ..queries import q
from ._core import (
    LEASED_CLAIM,
    Exercise,
    admin,
    claimed,
    fill_queue,
    first_nudge,
    over_runs,
    run_answer,
    worker,
)
from ._sandbox import Sandbox

BURST = 30
WORKERS = 3
#: The runs: (the noisy tenant, the small tenants). Varied, so that a claim that favours tenant
#: ids (a priority, not fairness) is seen: the noisy tenant is the lowest id, the highest, and
#: one in the middle, with six, six and four small tenants.
RUNS = ((1, tuple(range(2, 8))), (9, tuple(range(1, 7))), (4, (1, 2, 5, 6)))
#: The runs' first small tenants, as the notebook's text says them.
SMALL = RUNS[0][1]


def bound(small: tuple[int, ...]) -> int:
    """A small tenant's job may wait for one round of the tenants with work, plus the claims
    in flight."""
    return 2 * len(small)


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


def scenario(answer: str, sb: Sandbox) -> tuple[list[Check], str]:
    """Drain a burst and the small tenants' jobs, three times with other tenants."""
    return over_runs([(f"tenant {noisy}'s burst, tenants {_names(small)} one job each",
                       _run(answer, sb, noisy, small)) for noisy, small in RUNS])


def _names(tenants: tuple[int, ...]) -> str:
    return ", ".join(map(str, tenants))


def _run(answer: str, sb: Sandbox, noisy: int, small: tuple[int, ...]
         ) -> tuple[list[Check], str]:
    order: list[tuple[int, int]] = []  # (job, tenant) per claim, in claim order
    bad_claim: str | None = None
    twice: int | None = None
    total = BURST + len(small)
    with admin(sb, "fair") as conn_admin, ExitStack() as stack:
        jobs = fill_queue(conn_admin, ((noisy, "count", BURST), *((t, "count", 1) for t in small)))
        workers = [stack.enter_context(worker(sb, f"fair {n}")) for n in range(WORKERS)]
        seen: set[int] = set()
        for _ in range(total + 1):
            held = []
            for conn in workers:
                what = f"claim {len(order) + 1}"
                # full, window: what the production round-robin claim also takes (fair.py);
                # full: every claim lists every tenant with work.
                params = {"lease": 30, "kinds": ["count"], "batch": 1, "limit": 1,
                          "queues": ["default"], "full": True, "window": 32}
                took = claimed(run_answer(conn, answer, params, what), what)
                problem = jobs.claim(took, what, committed=True)
                if problem and bad_claim is None:
                    bad_claim = problem
                for job, attempt in took:
                    order.append((job, jobs.state(job)["tenant_id"]))
                    if job in seen and twice is None:
                        twice = job
                    seen.add(job)
                    held.append((conn, job, attempt))
            if not held:
                break
            for conn, job, attempt in held:
                conn.execute(q("complete_if_owner"), {"id": job, "attempt": attempt,
                                                      "worker": "exercise", "started": None})
            jobs.changed()
        final = jobs.now().values()
        done = sum(1 for j in final if j["status"] == "done")
        burst_done = sum(1 for j in final if j["status"] == "done" and j["tenant_id"] == noisy)
    return judge(order, bad_claim, twice, done, burst_done, noisy, small)


def judge(order: list[tuple[int, int]], bad: str | None, twice: int | None,
          done: int, burst_done: int, noisy: int = 1, small: tuple[int, ...] = SMALL
          ) -> tuple[list[Check], str]:
    total = BURST + len(small)
    limit = bound(small)
    positions = {t: next((i + 1 for i, (_, tt) in enumerate(order) if tt == t), None)
                 for t in small}
    got = [p for p in positions.values() if p is not None]
    latest = max(got) if len(got) == len(small) else None
    fair_ok = latest is not None and latest <= limit
    if latest is None:
        missing = [t for t, p in positions.items() if p is None]
        fair_nudge = (f"tenant {missing[0]}'s job was never claimed: a fair claim still serves "
                      "every tenant")
    else:
        fair_nudge = (f"the small tenants' jobs were claimed at positions {min(got)} to {latest} "
                      f"of {len(order)}: some waited behind tenant {noisy}'s burst of {BURST}. "
                      "Which job would the claim take if it looked at the tenants, not only the "
                      "ages? (Ordering by tenant id is a priority: it favours some tenants, "
                      "whoever is noisy.)")
    if twice is not None:
        all_nudge = f"job {twice} was claimed twice: a claim must not take a job that is running"
    elif burst_done < BURST:
        all_nudge = (f"tenant {noisy}'s burst: {burst_done} of {BURST} jobs done. Fair is not "
                     "starving the busy tenant: it must still be served when its turn comes")
    else:
        all_nudge = f"{done} of {total} jobs done: every job must be claimed and finished once"
    claim_nudge = "" if bad is None else (
        f"{bad} (the FIFO claim does all of it; keep its shape and change only which job it "
        "takes)")
    pairs: list[tuple[Check, str]] = [
        (check("each claim: running, counted once, leased", bad is None,
               "every job it took", "every job it took" if bad is None else bad.split(":")[0]),
         claim_nudge),
        (check("the small tenants' jobs claimed by", fair_ok,
               f"claim {limit} of {total} at the latest",
               f"claim {latest}" if latest else "never"),
         fair_nudge),
        (check("every job claimed once and done", done == total and twice is None,
               f"{total} of {total}, none twice",
               f"{done} of {total}" + (f", job {twice} twice" if twice else "")), all_nudge),
    ]
    return first_nudge(pairs)


EXERCISE = Exercise(
    id="noisy-neighbour", notebook="11", title="a fair claim",
    task="The claim three workers run, each in its turn (%(lease)s is the lease in seconds; "
         "%(limit)s = 1 is there if you want it). Tenant 1's burst of 30 jobs went in first; "
         "tenants 2 to 7 have one job each: they must not wait for the whole burst. The check "
         "runs three times, with the noisy tenant the lowest id, the highest and one between.",
    starter=STARTER, answer=ANSWER, hints=HINTS, scenario=scenario)
