"""The scenarios: each an id, one property, a bound, a script that drives it, and a checker.

The script says who does what (the suite enqueues, freezes, restarts); the checker
(``checks.py``) judges what was seen. A scenario's ``bound`` is a cap: a trial is watched until
the row's own settings make its jobs final (``runner.bound``), at most the cap, so the whole
matrix runs in minutes; a safety job whose settings make it final only past the cap is ``◷``,
with the time its settings give. The ★ rows run the libraries' true defaults; the short
timings a takeover needs come from the ``scaled`` rows (every queue's own timers set to the
same lease, 2 s).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import checks
from .checks import Result, Trial

#: Scenarios whose cell is a number, not a verdict.
MEASURED = ("wake", "throughput")
#: The longest the late-finish scenario keeps a worker frozen waiting for a takeover.
FREEZE = 16.0


@dataclass(frozen=True)
class Scenario:
    id: str
    property: str
    bound: float
    script: Callable[[Any], None]
    checker: Callable[[Trial], Result]
    workers: int = 1
    restart: bool = False      # the suite restarts workers that end
    cluster: bool = False      # a throwaway cluster of its own (it gets restarted)
    pooler: bool = False       # workers reach the database through PgBouncer
    feature: str | None = None  # needs this adapter feature, else n/a
    queue_first: bool = False  # the script queues everything before the workers start


def _first_run(ctx: Any, job: str) -> Any:
    return next((e for e in ctx.executions() if e.job == job), None)


def poison(ctx: Any) -> None:
    ctx.enqueue("poison")
    ctx.enqueue("ok")


def crash(ctx: Any) -> None:
    ctx.enqueue("crash")
    ctx.enqueue("ok")


def overrun(ctx: Any) -> None:
    # Blocking work written as each library's docs say (a thread: procrastinate's sync task,
    # PgQueuer's asyncio.to_thread), alone in its batch.
    ctx.enqueue("block", seconds=2.5 * ctx.options.lease)


def block_loop(ctx: Any) -> None:
    # Against the docs: blocking work called straight on the event loop (the heartbeat shares
    # that loop). Alone in its batch, so its verdict mixes with no other job's.
    ctx.enqueue("block-loop", seconds=2.5 * ctx.options.lease)


def late_finish(ctx: Any) -> None:
    lease = ctx.options.lease
    job = ctx.enqueue("sleep", seconds=2.5 * lease)
    if not ctx.wait(ctx.trial.bound / 2, until=lambda: _first_run(ctx, job.id) is not None):
        return
    first = _first_run(ctx, job.id)
    ctx.wait(0.5)
    ctx.freeze(first.pid)
    frozen = ctx.trial.faults[-1].t
    # Frozen until another worker has taken the job over (or for the row's own timeout and 6 s
    # to notice, at most FREEZE s): its body's deadline passes meanwhile, so once thawed it
    # finishes while the new owner still runs. No takeover in that time: the checker says n/a.
    timeout = ctx.trial.policy.timeout or lease
    ctx.wait(min(timeout + 6, FREEZE),
             until=lambda: sum(e.job == job.id for e in ctx.executions()) > 1)
    ctx.thaw(first.pid)
    ctx.trial.notes["frozen_s"] = round(ctx.trial.faults[-1].t - frozen, 1)


def restart(ctx: Any) -> None:
    jobs = [ctx.enqueue("sleep", tenant=1 + i % 10, seconds=0.3) for i in range(16)]
    ids = {j.id for j in jobs}
    ctx.wait(5, until=lambda: sum(e.end is not None and e.job in ids
                                  for e in ctx.executions()) >= 3)
    ctx.restart_server()


def terminate(ctx: Any) -> None:
    for i in range(8):
        ctx.enqueue("sleep", tenant=1 + i, seconds=0.6)
    ctx.wait(5, until=lambda: any(e.end is None for e in ctx.executions()))
    ctx.trial.notes["sessions_terminated"] = len(ctx.terminate_sessions())


def tenant_leak(ctx: Any) -> None:
    # The first job sets its tenant in the session form, as a careless hook would.
    ctx.enqueue("tenant", tenant=7, session=True)
    ctx.enqueue("tenant", tenant=8)
    ctx.enqueue("tenant", tenant=9)


def pgbouncer(ctx: Any) -> None:
    for i in range(10):
        ctx.enqueue("ok", tenant=1 + i)
    ctx.enqueue("sleep", tenant=11, seconds=0.5)
    ctx.enqueue("sleep", tenant=12, seconds=0.5)


def wake(ctx: Any) -> None:
    warm = ctx.enqueue("ok")
    ctx.wait(5, until=lambda: ctx.states.get(warm.id) == "done")
    spacing = random.Random(29)
    for _ in range(5):
        # Idle: the worker is waiting, not working. Jittered, so the probes do not lock in
        # phase with a row's poll period.
        ctx.wait(spacing.uniform(0.4, 1.6))
        probe = ctx.enqueue("ok", probe=True)
        ctx.wait(2, until=lambda probe=probe: _first_run(ctx, probe.id) is not None)


def throughput(ctx: Any) -> None:
    # Queued before the workers start: what is measured is the workers, not the enqueues.
    for i in range(100):
        ctx.enqueue("ok", tenant=1 + i % 100)


SCENARIOS: dict[str, Scenario] = {s.id: s for s in [
    Scenario("poison", "a job that fails every attempt runs at most its budget and is final "
             "when its retry schedule says, and the job behind it runs", 15, poison,
             checks.check_poison),
    Scenario("crash", "a job that kills its worker every attempt runs at most its budget and is "
             "final when its settings say (the suite restarts killed workers)", 30, crash,
             checks.check_crash, restart=True),
    Scenario("overrun", "a job longer than the row's timeout, its blocking work in a thread as "
             "the docs say, never runs twice", 20, overrun, checks.check_overrun, workers=3),
    Scenario("block-loop", "against the docs: a job longer than the row's timeout that blocks "
             "the event loop never runs twice", 20, block_loop, checks.check_overrun, workers=3,
             feature="event-loop"),
    Scenario("late-finish", "a worker frozen past its lease and resumed after a takeover does "
             "not finish the job over its new owner", 30, late_finish, checks.check_late_finish,
             workers=2),
    Scenario("restart", "an immediate PostgreSQL restart under load loses no job and runs none "
             "twice under documented supervision; whether the worker survives is shown", 20,
             restart, checks.check_restart, workers=2, cluster=True, restart=True),
    Scenario("terminate", "pg_terminate_backend on the workers' sessions mid-job: no job lost "
             "under documented supervision; whether the worker survives is shown", 15,
             terminate, checks.check_terminate, workers=2, restart=True),
    Scenario("tenant-leak", "a tenant one job set in the session form does not reach the next "
             "job", 10, tenant_leak, checks.check_tenant_leak, feature="tenant-hook"),
    Scenario("pgbouncer", "every job through PgBouncer in transaction mode: all done, none "
             "twice at once, no worker exits", 15, pgbouncer, checks.check_pgbouncer, workers=2,
             pooler=True),
    Scenario("wake", "measured: from an idle enqueue's insert on the server's clock to the "
             "body's start; jittered spacing", 15, wake, checks.check_wake),
    Scenario("throughput", "measured: 100 short jobs queued, then two workers: jobs per second "
             "from the first start to the last end", 30, throughput, checks.check_throughput,
             workers=2, queue_first=True),
]}


def unknown(names: list[str]) -> list[str]:
    return [n for n in names if n not in SCENARIOS]
