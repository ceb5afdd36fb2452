"""The checkers: plain functions from what a trial saw to pass / fail / indeterminate.

A ``Trial`` is everything the runner observed of one scenario on one queue: the jobs it queued,
the executions the suite's bodies wrote to the history (``history.Execution``), the queue's own
states (final, and snapshots taken while it ran), the faults the suite applied, and the worker
processes that exited on their own. A checker reads only that, so it is tested on synthetic
trials as well as live (Jepsen's habit). Each ``fail`` carries witness sentences that name jobs,
pids and times (seconds since the trial's first enqueue).

Rules every checker keeps: a job not terminal when the bound has passed is a failure (the bound
is the property); a suite error is ``indeterminate``, never ``pass``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

from .adapter import TERMINAL
from .history import Execution, by_job

Verdict = Literal["pass", "fail", "na", "indeterminate"]
#: Executions of one job that run together for less than this are clock noise, not an overlap.
OVERLAP_NOISE = 0.05


@dataclass
class Job:
    """One job the suite queued."""

    id: str
    kind: str
    tenant: int
    payload: dict[str, Any]
    enqueued: float  # time.time() once the enqueue call returned (its commit is before)
    requested: float | None = None  # time.time() when the enqueue call was made


@dataclass
class Fault:
    """One thing the suite did to the workers or the server: kill, stop, cont, restart,
    terminate (``pid`` None for the server)."""

    t: float
    action: str
    pid: int | None = None
    detail: str = ""


@dataclass
class Trial:
    """What one scenario run on one queue saw."""

    scenario: str
    bound: float
    t0: float                     # the first enqueue: the bound counts from here
    end: float                    # when observation stopped
    jobs: list[Job] = field(default_factory=list)
    executions: list[Execution] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)          # final, mapped
    snapshots: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    #: worker pid: (when, exit status, its last output line) for workers that ended on their own
    exits: dict[int, tuple[float, int | None, str]] = field(default_factory=dict)
    max_attempts: int = 3
    lease: float = 2.0
    error: str | None = None      # the suite's own failure: indeterminate
    notes: dict[str, Any] = field(default_factory=dict)

    def at(self, t: float) -> str:
        return f"{t - self.t0:.1f} s"

    def kind(self, job: str) -> str:
        return next((j.kind for j in self.jobs if j.id == job), "?")

    def died(self, pid: int) -> float | None:
        """When the worker process ``pid`` ended (killed by the suite or on its own), if it did."""
        if pid in self.exits:
            return self.exits[pid][0]
        kills = [f.t for f in self.faults if f.action == "kill" and f.pid == pid]
        return min(kills) if kills else None

    def finish_of(self, e: Execution) -> float:
        """When an execution stopped running: its end, its process's death, or the trial's end."""
        if e.end is not None:
            return e.end
        died = self.died(e.pid)
        return died if died is not None else self.end


@dataclass
class Result:
    """A checker's answer for one run: the verdict, its witness sentences, what was measured."""

    result: Verdict
    witness: list[str] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)


# --- sentences the checkers share --------------------------------------------------------------


def _pids(execs: list[Execution]) -> str:
    pids = sorted({e.pid for e in execs})
    if len(pids) > 4:
        return f"{len(pids)} pids, {pids[0]}, {pids[1]} ... {pids[-1]}"
    return ("pid " if len(pids) == 1 else "pids ") + (
        ", ".join(map(str, pids[:-1])) + (" and " if len(pids) > 1 else "") + str(pids[-1]))


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def not_terminal(trial: Trial, jobs: list[str] | None = None) -> list[str]:
    """Witnesses for jobs not in a final state when the bound had passed (the first three in
    full, then the others by id)."""
    out = _not_terminal(trial, jobs)
    if len(out) <= 3:
        return [s for s, _ in out]
    rest = [job for _, job in out[2:]]
    return [s for s, _ in out[:2]] + [
        f"and {len(rest)} more jobs not final when the bound had passed: {', '.join(rest)}"]


def _not_terminal(trial: Trial, jobs: list[str] | None) -> list[tuple[str, str]]:
    out = []
    execs = by_job(trial.executions)
    for job in jobs if jobs is not None else [j.id for j in trial.jobs]:
        state = trial.states.get(job, "missing")
        if state in TERMINAL:
            continue
        runs = execs.get(job, [])
        span = f" in {runs[-1].start - runs[0].start:.1f} s" if len(runs) > 2 else ""
        ran = (f"ran {_times(len(runs))}{span} ({_pids(runs)})" if runs else "never ran")
        attempts = [e.attempt for e in runs if e.attempt is not None]
        past = (f", attempt {max(attempts)} past max_attempts {trial.max_attempts}"
                if attempts and max(attempts) > trial.max_attempts else "")
        out.append((f"job {job} ({trial.kind(job)}) {ran}{past}; the table still said {state} "
                    f"when the bound of {trial.bound:g} s had passed", job))
    return out


def overlaps(trial: Trial) -> list[str]:
    """Witnesses for jobs whose executions ran at the same time, with what the table says."""
    out = []
    for job, runs in by_job(trial.executions).items():
        for i, a in enumerate(runs):
            for b in runs[i + 1:]:
                a_end, b_end = trial.finish_of(a), trial.finish_of(b)
                both = min(a_end, b_end) - max(a.start, b.start)
                if both > OVERLAP_NOISE:
                    ok = sum(1 for e in runs if e.outcome == "ok")
                    out.append(
                        f"job {job} ({trial.kind(job)}) ran {_times(len(runs))}, pids {a.pid} and "
                        f"{b.pid} overlapping {both:.1f} s (from {trial.at(max(a.start, b.start))}); "
                        f"{ok} of its executions ended ok; the table says "
                        f"{trial.states.get(job, 'missing')}")
                    break
            else:
                continue
            break
    return out


def exited(trial: Trial) -> list[str]:
    """Witnesses for worker processes that exited without the suite killing them."""
    return [f"worker pid {pid} exited at {trial.at(t)} with status {rc}"
            + (f" ({line})" if line else "")
            for pid, (t, rc, line) in sorted(trial.exits.items(), key=lambda kv: kv[1][0])]


def _verdict(witness: list[str], measured: dict[str, Any]) -> Result:
    return Result("fail" if witness else "pass", witness, measured)


def _suite_error(trial: Trial) -> Result | None:
    if trial.error:
        return Result("indeterminate", [f"the suite could not judge this run: {trial.error}"])
    return None


def _of_kind(trial: Trial, *kinds: str) -> list[Job]:
    return [j for j in trial.jobs if j.kind in kinds]


# --- the checkers -------------------------------------------------------------------------------


def check_poison(trial: Trial) -> Result:
    """A job that fails every attempt reaches a final state within the bound, and the job
    queued behind it runs."""
    if (r := _suite_error(trial)) is not None:
        return r
    execs = by_job(trial.executions)
    poison = _of_kind(trial, "poison")
    behind = _of_kind(trial, "ok")
    if not poison:
        return Result("indeterminate", ["no poison job was queued"])
    witness = not_terminal(trial)
    for j in behind:
        if trial.states.get(j.id) in TERMINAL and not any(e.outcome == "ok"
                                                          for e in execs.get(j.id, [])):
            witness.append(f"job {j.id}, queued behind the poison job, is "
                           f"{trial.states.get(j.id)} but its body never ended ok")
    return _verdict(witness, {"poison_executions": sum(len(execs.get(p.id, [])) for p in poison),
                              "poison_state": [trial.states.get(p.id) for p in poison]})


def check_crash(trial: Trial) -> Result:
    """A job that kills its worker reaches a final state within the bound, after a bounded
    number of executions, while the suite keeps restarting the killed workers."""
    if (r := _suite_error(trial)) is not None:
        return r
    execs = by_job(trial.executions)
    crash = _of_kind(trial, "crash")
    if not crash:
        return Result("indeterminate", ["no crash job was queued"])
    if not any(execs.get(c.id) for c in crash):
        return Result("indeterminate", ["the crash job never started: nothing to judge"])
    witness = not_terminal(trial)
    for c in crash:
        runs = execs.get(c.id, [])
        if len(runs) > trial.max_attempts:
            witness.append(f"job {c.id} (crash) killed {len(runs)} workers, max_attempts "
                           f"{trial.max_attempts}: its executions have no bound")
    restarts = sum(1 for f in trial.faults if f.action == "restart-worker")
    return _verdict(witness, {"crash_executions": sum(len(execs.get(c.id, [])) for c in crash),
                              "workers_restarted": restarts,
                              "crash_state": [trial.states.get(c.id) for c in crash]})


def check_overrun(trial: Trial) -> Result:
    """A job longer than the lease (or timeout) is not run twice at once, whether its body
    yields (``sleep``) or blocks its thread (``block``)."""
    if (r := _suite_error(trial)) is not None:
        return r
    if not trial.executions:
        return Result("indeterminate", ["no job started within the bound"])
    witness = overlaps(trial) + not_terminal(trial)
    execs = by_job(trial.executions)
    return _verdict(witness, {f"{j.kind}_executions": len(execs.get(j.id, []))
                              for j in trial.jobs})


def check_late_finish(trial: Trial) -> Result:
    """A worker frozen past its lease, taken over, then resumed: its late finish is fenced
    out (the table never shows the job final while the new owner still runs it)."""
    if (r := _suite_error(trial)) is not None:
        return r
    execs = by_job(trial.executions)
    witness = []
    for job, runs in execs.items():
        if len(runs) < 2:
            continue
        for t, states in trial.snapshots:
            state = states.get(job)
            if state not in TERMINAL:
                continue
            owner = [e for e in runs[1:] if e.start < t < trial.finish_of(e)]
            if owner:
                late = runs[0]
                witness.append(
                    f"job {job}: worker pid {late.pid}, frozen past its lease and resumed, "
                    f"finished it (its execution ended {trial.at(late.end or t)}); the table "
                    f"said {state} at {trial.at(t)} while pid {owner[0].pid} (taken over at "
                    f"{trial.at(owner[0].start)}) was still running it")
                break
    witness += not_terminal(trial)
    takeover = any(len(r) > 1 for r in execs.values())
    if not trial.executions:
        return Result("indeterminate", ["the job never started: nothing to freeze"])
    return _verdict(witness, {"taken_over": takeover,
                              "executions": len(trial.executions),
                              "frozen_s": trial.notes.get("frozen_s")})


def _under_fault(trial: Trial, what: str) -> Result:
    """Jobs queued around a fault: none lost, none run twice at once, no worker gone."""
    witness = not_terminal(trial) + overlaps(trial) + exited(trial)
    execs = by_job(trial.executions)
    again = [job for job, runs in execs.items() if sum(e.outcome == "ok" for e in runs) > 1]
    return _verdict(witness, {"jobs": len(trial.jobs),
                              "done": sum(1 for s in trial.states.values() if s == "done"),
                              "ran_again": len(again), "workers_exited": len(trial.exits),
                              **trial.notes})


def check_restart(trial: Trial) -> Result:
    """An immediate PostgreSQL restart under load: no job lost, none run twice at once, no
    worker exits (the suite does not restart them)."""
    if (r := _suite_error(trial)) is not None:
        return r
    if not any(f.action == "restart" for f in trial.faults):
        return Result("indeterminate", ["the server was never restarted"])
    return _under_fault(trial, "restart")


def check_terminate(trial: Trial) -> Result:
    """``pg_terminate_backend`` on the workers' sessions mid-job: the workers recover by
    themselves (no process restart), no job lost or run twice at once."""
    if (r := _suite_error(trial)) is not None:
        return r
    if not any(f.action == "terminate" and f.pid for f in trial.faults):
        return Result("indeterminate", ["no worker session was found to terminate"])
    return _under_fault(trial, "terminate")


def check_pgbouncer(trial: Trial) -> Result:
    """Every job through PgBouncer in transaction mode: all done, none run twice at once, no
    worker exits."""
    if (r := _suite_error(trial)) is not None:
        return r
    return _under_fault(trial, "pgbouncer")


def check_tenant_leak(trial: Trial) -> Result:
    """A tenant one job set in the session form does not reach the next job."""
    if (r := _suite_error(trial)) is not None:
        return r
    tenant_jobs = {j.id: j for j in _of_kind(trial, "tenant")}
    seen = [e for e in trial.executions if e.job in tenant_jobs]
    if not seen:
        return Result("indeterminate", ["no tenant job ran"])
    witness = []
    for e in seen:
        own = tenant_jobs[e.job].tenant
        if e.seen_tenant not in (None, "", str(own), own):
            witness.append(f"job {e.job} for tenant {own} (pid {e.pid}, at {trial.at(e.start)}) "
                           f"started with tenant {e.seen_tenant} set on its connection")
    witness += not_terminal(trial)
    return _verdict(witness, {"tenant_jobs": len(seen)})


def check_wake(trial: Trial) -> Result:
    """Measured: seconds from an idle enqueue to the body's start."""
    if (r := _suite_error(trial)) is not None:
        return r
    first = {job: runs[0].start for job, runs in by_job(trial.executions).items()}
    probes = [j for j in trial.jobs if j.payload.get("probe")]
    # From the call's return: the commit came before it, so a worker woken by it may start
    # before the call has returned (then 0).
    lat = [max(0.0, first[j.id] - j.enqueued) for j in probes if j.id in first]
    if not lat:
        return Result("indeterminate", ["no probe job started within the bound"])
    calls = [j.enqueued - j.requested for j in probes if j.requested is not None]
    measured = {"median_ms": round(1000 * statistics.median(lat), 1),
                "max_ms": round(1000 * max(lat), 1), "probes": len(lat),
                "enqueue_call_ms": round(1000 * statistics.median(calls), 1) if calls else None}
    witness = not_terminal(trial, [j.id for j in probes])
    return Result("fail" if witness else "pass", witness, measured)


def check_throughput(trial: Trial) -> Result:
    """Measured: jobs per second from the first start to the last end."""
    if (r := _suite_error(trial)) is not None:
        return r
    ended = [e for e in trial.executions if e.end is not None and e.outcome == "ok"]
    if len(ended) < 2:
        return Result("indeterminate", ["fewer than two jobs finished within the bound"])
    span = max(e.end or 0 for e in ended) - min(e.start for e in trial.executions)
    measured = {"jobs": len(trial.jobs), "done": len(ended),
                "jobs_per_s": round(len(ended) / span, 1) if span > 0 else None}
    witness = not_terminal(trial)
    return Result("fail" if witness else "pass", witness[:3], measured)
