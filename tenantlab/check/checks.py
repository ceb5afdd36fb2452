"""The checkers: plain functions from what a trial saw to pass / fail / indeterminate.

A ``Trial`` is everything the runner observed of one scenario on one queue: the jobs it queued,
the executions the suite's bodies wrote to the history (``history.Execution``), the queue's own
states (final, and snapshots taken while it ran), the faults the suite applied, and the worker
processes that exited on their own. A checker reads only that, so it is tested on synthetic
trials as well as live (Jepsen's habit). Each ``fail`` carries witness sentences that name jobs,
pids and times (seconds since the trial's first enqueue).

Rules every checker keeps: a suite error is ``indeterminate``, never ``pass``. A safety cell
(poison, crash) states two facts about its job: *bounded* (its executions within the row's
attempt budget, ``Policy.budget``, or "no budget") and *time to final*, judged against when the
row's own settings make it final (``Policy.poison_final`` / ``crash_final``), not one stopwatch
for every row: bounded and final = ``pass`` with the time shown; more executions than the budget
= ``fail`` however fast; never final by its settings = ``fail``; final by its settings only past
the scenario's cap = ``capped`` (the cell says when). A ✓ is earned: late-finish without a
takeover and overrun with a job shorter than the row's timeout are ``na``; a second execution
after the table said done is a double execution whatever the overlap.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

from .adapter import TERMINAL, Policy
from .history import Execution, by_job

Verdict = Literal["pass", "fail", "na", "indeterminate", "capped"]
#: Where an execution's end is inferred (its process was seen dead by a poll every 0.1 s), an
#: overlap shorter than this may be the poll's lateness. Executions whose ends were both written
#: by their bodies overlap at any positive length: there is no noise threshold for them.
OVERLAP_NOISE = 0.15


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
    policy: Policy = field(default_factory=lambda: Policy(budget=3, timeout=2.0))
    cap: float | None = None      # the scenario's cap (the bound is derived from the policy)

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
    """Witnesses for jobs run twice: executions that ran at the same time (any positive overlap
    where both bodies wrote their ends), or a second execution that started after the table had
    already said the job was done, whatever the overlap."""
    out = []
    for job, runs in by_job(trial.executions).items():
        found = _double(trial, job, runs)
        if found:
            out.append(found)
    return out


def _done_before(trial: Trial, job: str, t: float) -> float | None:
    """When the table first said ``job`` was done, if that was before ``t``."""
    for when, states in trial.snapshots:
        if when >= t:
            return None
        if states.get(job) == "done":
            return when
    return None


def _double(trial: Trial, job: str, runs: list[Execution]) -> str | None:
    ok = sum(1 for e in runs if e.outcome == "ok")
    table = trial.states.get(job, "missing")
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            said = _done_before(trial, job, b.start)
            if said is not None:
                return (f"job {job} ({trial.kind(job)}) ran again at {trial.at(b.start)} (pid "
                        f"{b.pid}) after the table had said done at {trial.at(said)} (pid "
                        f"{a.pid} ran it first); {ok} of its executions ended ok; the table says "
                        f"{table}: a double execution")
            both = min(trial.finish_of(a), trial.finish_of(b)) - max(a.start, b.start)
            noise = 0.0 if a.end is not None and b.end is not None else OVERLAP_NOISE
            if both > noise:
                return (f"job {job} ({trial.kind(job)}) ran {_times(len(runs))}, pids {a.pid} and "
                        f"{b.pid} overlapping {both:.2f} s (from "
                        f"{trial.at(max(a.start, b.start))}); {ok} of its executions ended ok; "
                        f"the table says {table}")
    return None


def human(seconds: float) -> str:
    """Seconds as a person reads them: 12 s, 3.5 min, 2.1 h, 9.7 d."""
    if seconds < 120:
        return (f"{seconds:.2f} s" if seconds < 1 else f"{seconds:.1f} s" if seconds < 100
                else f"{seconds:.0f} s")
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def loop(trial: Trial, job: str, runs: list[Execution]) -> str:
    """One sentence describing how a job was run again and again: how often, by whom, what
    attempt numbers it saw."""
    starts = [e.start for e in runs]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    every = f", every ~{human(statistics.median(gaps))}" if gaps else ""
    attempts = [e.attempt for e in runs if e.attempt is not None]
    if len(attempts) > 1 and len(set(attempts)) == 1:
        counted = f"; its attempt number stayed {attempts[0]}: the re-runs were never counted"
    elif attempts:
        counted = f"; attempt numbers {attempts[0]} to {max(attempts)}"
    else:
        counted = ""
    outcomes = sorted({e.outcome or "killed" for e in runs})
    span = f" in {runs[-1].start - runs[0].start:.1f} s" if len(runs) > 1 else ""
    return (f"job {job} ({trial.kind(job)}) ran {_times(len(runs))}{span}{every} "
            f"({_pids(runs)}; {'/'.join(outcomes)}){counted}")


def finality(trial: Trial, job: Job, final_by: float | None) -> tuple[Verdict, list[str],
                                                                       dict[str, Any]]:
    """The two facts of a safety cell for ``job``: bounded (its executions within the row's
    budget) and time to final (observed, or when its settings make it final: ``final_by``
    seconds after its first start, None for never)."""
    runs = by_job(trial.executions).get(job.id, [])
    budget = trial.policy.budget
    state = trial.states.get(job.id, "missing")
    first = runs[0].start if runs else job.enqueued
    final_at = next((t for t, st in trial.snapshots if st.get(job.id) in TERMINAL), None)
    if final_at is None and state in TERMINAL:
        final_at = trial.end
    measured: dict[str, Any] = {
        "executions": len(runs), "budget": budget if budget is not None else "no budget",
        "bounded": budget is None or len(runs) <= budget, "state": state,
        "final_s": round(final_at - first, 1) if final_at is not None else None,
        "final_by_settings_s": round(final_by, 1) if final_by is not None else None}
    basis = f" ({trial.policy.basis})" if trial.policy.basis else ""
    if budget is not None and len(runs) > budget:
        return "fail", [f"unbounded: {loop(trial, job.id, runs)}, past its budget of {budget} "
                        f"executions; the table says {state}"], measured
    if final_at is not None:
        return "pass", [], measured
    seen = trial.end - first
    if final_by is None:
        return "fail", [f"never final by its settings{basis}: "
                        f"{loop(trial, job.id, runs) if runs else f'job {job.id} never ran'}; "
                        f"the table still said {state} at {trial.at(trial.end)}"], measured
    if seen >= final_by + max(2.0, 0.15 * final_by):
        return "fail", [f"its settings make job {job.id} ({job.kind}) final by "
                        f"{human(final_by)} after its first start{basis}, but the table still "
                        f"said {state} {human(seen)} after it "
                        f"({loop(trial, job.id, runs) if runs else 'it never ran'})"], measured
    cap = f"the {human(trial.cap)} cap" if trial.cap else "the cap"
    return "capped", [f"bounded so far ({len(runs)} of "
                      f"{budget if budget is not None else 'no budget'} executions in the "
                      f"{human(seen)} watched); its settings make job {job.id} ({job.kind}) final "
                      f"about {human(final_by)} after its first start{basis}, past {cap}: not "
                      f"observed"], measured


def _combine(verdicts: list[Verdict]) -> Verdict:
    for v in ("fail", "indeterminate", "capped", "na"):
        if v in verdicts:
            return v  # type: ignore[return-value]
    return "pass"


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


def _safety(trial: Trial, kind: str, final_by: float | None, behind: str) -> Result:
    """A safety cell: the ``kind`` job's two facts, and the jobs queued beside it must run."""
    execs = by_job(trial.executions)
    jobs = _of_kind(trial, kind)
    if not jobs:
        return Result("indeterminate", [f"no {kind} job was queued"])
    if kind == "crash" and not any(execs.get(j.id) for j in jobs):
        return Result("indeterminate", ["the crash job never started: nothing to judge"])
    verdicts: list[Verdict] = []
    witness: list[str] = []
    measured: dict[str, Any] = {}
    for j in jobs:
        v, w, m = finality(trial, j, final_by)
        verdicts.append(v)
        witness += w
        measured.update({f"{kind}_{k}": x for k, x in m.items()})
    others = [j.id for j in trial.jobs if j.kind != kind]
    stuck = not_terminal(trial, others)
    stuck = [f"{w} ({behind})" for w in stuck]
    for j in trial.jobs:
        if j.kind != kind and trial.states.get(j.id) in TERMINAL and not any(
                e.outcome == "ok" for e in execs.get(j.id, [])):
            stuck.append(f"job {j.id}, queued beside the {kind} job, is "
                         f"{trial.states.get(j.id)} but its body never ended ok")
    if stuck:
        verdicts.append("fail")
        witness += stuck
    verdict = _combine(verdicts)
    if verdict == "pass":
        witness = []
    return Result(verdict, witness, measured)


def check_poison(trial: Trial) -> Result:
    """A job that fails every attempt is bounded by the row's budget and final when its settings
    say (its retry schedule), and the job queued behind it runs."""
    if (r := _suite_error(trial)) is not None:
        return r
    return _safety(trial, "poison", trial.policy.poison_final, "queued behind the poison job")


def check_crash(trial: Trial) -> Result:
    """A job that kills its worker every attempt is bounded by the row's budget and final when
    its settings say (detection time and retries), while the suite restarts the killed workers
    as a supervisor would; the job queued beside it runs."""
    if (r := _suite_error(trial)) is not None:
        return r
    r = _safety(trial, "crash", trial.policy.crash_final, "queued beside the crash job")
    r.measured["workers_restarted"] = sum(1 for f in trial.faults if f.action == "restart-worker")
    return r


def check_overrun(trial: Trial) -> Result:
    """A job longer than the row's timeout is not run twice at once (nor again after it was
    done), whether its body yields or blocks its thread. A job shorter than the timeout tests
    nothing: ``na``, unless it ran twice anyway."""
    if (r := _suite_error(trial)) is not None:
        return r
    if not trial.executions:
        return Result("indeterminate", ["no job started within the bound"])
    execs = by_job(trial.executions)
    measured: dict[str, Any] = {f"{j.kind}_executions": len(execs.get(j.id, []))
                                for j in trial.jobs}
    longest = max((float(j.payload.get("seconds", 0)) for j in trial.jobs), default=0.0)
    timeout = trial.policy.timeout
    measured["job_s"], measured["timeout_s"] = longest, timeout
    double = overlaps(trial)
    if double:
        return Result("fail", double + not_terminal(trial), measured)
    if timeout is None or longest <= timeout:
        why = ("the row never takes a running job over" if timeout is None else
               f"its timeout is {human(timeout)}")
        return Result("na", [f"nothing to overrun: the job runs {human(longest)} and {why}"],
                      measured)
    return _verdict(not_terminal(trial), measured)


def check_late_finish(trial: Trial) -> Result:
    """A worker frozen past its lease, taken over, then resumed: its late finish is fenced
    out (the table never shows the job final while the new owner still runs it). Without a
    takeover there is nothing to fence: ``na`` (no takeover)."""
    if (r := _suite_error(trial)) is not None:
        return r
    execs = by_job(trial.executions)
    if not trial.executions:
        return Result("indeterminate", ["the job never started: nothing to freeze"])
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
    takeover = any(len(r) > 1 for r in execs.values())
    measured = {"taken_over": takeover, "executions": len(trial.executions),
                "frozen_s": trial.notes.get("frozen_s"), "timeout_s": trial.policy.timeout}
    if not takeover:
        return Result("na", [f"no takeover: the worker was frozen {trial.notes.get('frozen_s')} s "
                             f"and no other worker ran the job (timeout "
                             f"{human(trial.policy.timeout) if trial.policy.timeout else 'none'})"],
                      measured)
    witness += not_terminal(trial)
    return _verdict(witness, measured)


def _under_fault(trial: Trial, what: str) -> Result:
    """Jobs queued around a fault, as two facts: no job lost or run twice under the library's
    documented supervision (the suite restarts a worker that exits, as ``restart_on_failure``
    or systemd would), and whether the worker process survived the fault by itself. A job the
    fault interrupted that the row's own timeout runs again only after the cap is ``capped``
    (the witness says when), not lost."""
    execs = by_job(trial.executions)
    timeout = trial.policy.timeout
    late, lost = [], []
    for job in [j.id for j in trial.jobs]:
        if trial.states.get(job, "missing") in TERMINAL:
            continue
        runs = execs.get(job, [])
        # Started, then cut off (its body killed, or its finish lost with its session), or
        # claimed by a worker that then died (a batch fetched, not yet started): the row's
        # timeout runs it again, maybe only past the cap.
        fault = min((f.t for f in trial.faults if f.action in ("restart", "terminate")),
                    default=trial.t0)
        claimed = trial.states.get(job) == "running" and not runs
        # Still queued, never run, where the row polls less often than the trial lasted
        # (behind PgBouncer a LISTEN is lost: its docs' fallback is the poll).
        waiting = trial.states.get(job) == "queued" and not runs and \
            trial.t0 + trial.policy.poll + 2.0 > trial.end
        if waiting or (timeout is not None and (
                (claimed and fault + timeout + 2.0 > trial.end)
                or (runs and runs[-1].start + timeout + 2.0 > trial.end))):
            late.append(job)
        else:
            lost.append(job)
    witness = not_terminal(trial, lost) + overlaps(trial)
    again = [job for job, runs in execs.items() if sum(e.outcome == "ok" for e in runs) > 1]
    measured = {"jobs": len(trial.jobs),
                "done": sum(1 for s in trial.states.values() if s == "done"),
                "ran_again": len(again), "workers_exited": len(trial.exits),
                "worker_survives": not trial.exits, "no_job_lost": not witness,
                **trial.notes}
    if witness:
        r = Result("fail", witness, measured)
    elif late:
        wait = max(timeout or 0.0, trial.policy.poll)
        measured["final_by_settings_s"] = wait
        r = Result("capped", [f"{len(late)} job(s) not final when the trial ended "
                              f"({', '.join(late)}): by its settings they run only once its "
                              f"timeout ({human(timeout) if timeout else 'none'}) or its poll "
                              f"({human(trial.policy.poll)}) has come round after the {what}, "
                              f"later than the {human(trial.end - trial.t0)} this trial was "
                              f"watched: not observed"], measured)
    else:
        r = Result("pass", [], measured)
    if trial.exits:
        # Not a failure under supervision, but a fact the cell shows.
        r.witness += [f"(supervised) {w}" for w in exited(trial)]
    return r


def check_restart(trial: Trial) -> Result:
    """An immediate PostgreSQL restart under load: no job lost, none run twice, under the
    suite's supervision (it restarts a worker that exits); whether the worker survived is a
    second fact (``worker_survives``)."""
    if (r := _suite_error(trial)) is not None:
        return r
    if not any(f.action == "restart" for f in trial.faults):
        return Result("indeterminate", ["the server was never restarted"])
    return _under_fault(trial, "restart")


def check_terminate(trial: Trial) -> Result:
    """``pg_terminate_backend`` on the workers' sessions mid-job: no job lost or run twice under
    supervision; whether the workers recovered by themselves is a second fact."""
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
    """Measured: seconds from an idle enqueue to the body's start, from the server's timestamp of
    the inserting transaction where the adapter reads it (``notes["created"]``), else from the
    enqueue call's return (then a worker woken by the commit may start first: 0)."""
    if (r := _suite_error(trial)) is not None:
        return r
    first = {job: runs[0].start for job, runs in by_job(trial.executions).items()}
    probes = [j for j in trial.jobs if j.payload.get("probe")]
    created: dict[str, float] = trial.notes.get("created") or {}
    lat = [max(0.0, first[j.id] - created.get(j.id, j.enqueued)) for j in probes if j.id in first]
    if not lat:
        return Result("indeterminate", ["no probe job started within the bound"])
    calls = [j.enqueued - j.requested for j in probes if j.requested is not None]
    measured = {"median_ms": round(1000 * statistics.median(lat), 1),
                "max_ms": round(1000 * max(lat), 1), "probes": len(lat),
                "from": ("the insert's server timestamp" if all(j.id in created for j in probes)
                         else "the enqueue call's return"),
                "poll_s": trial.policy.poll,
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
                "jobs_per_s": round(len(ended) / span, 1) if span > 0 else None,
                "concurrency": trial.policy.concurrency}
    witness = not_terminal(trial)
    return Result("fail" if witness else "pass", witness[:3], measured)
