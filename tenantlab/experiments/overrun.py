"""Finding ``overrun``: a job outlives its lease and a second worker takes it over while it runs.

Two leased worker processes, one job each (``--max-jobs 1``), both polling an empty queue
every ``poll`` seconds; then one ``outside`` job (tenantlab/outside.py) is queued: it works
for ``job`` seconds and then calls the outside world, which appends a line to a file no
transaction can roll back. Whoever polls first claims it; the other keeps polling. Per variant
we count the **executions** (lines the outside world received) and the **completions** (the
job's ``job_runs`` rows that finished: a fenced execution's row rolls back with its work).

Variants (the article's setup: lease 2 s, job 3 s, polling every 100 ms, heartbeat 0.5 s):

- ``lease_only``: no fence, no heartbeat: both execute, both finish (the job ran twice);
- ``fence``: the late finish hits no row and rolls back, but both did the work;
- ``heartbeat``: the lease is extended while the job runs: one execution;
- ``stuck``: the first attempt hangs (stuck but alive) and keeps beating: never taken over;
- ``max_runtime``: the same stuck attempt, abandoned at the maximum runtime: its lease runs out,
  the other worker takes the job over and completes it, the stuck worker's late finish is fenced.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import pandas as pd

from .. import events as event_log
from .. import outside, queue
from ..heartbeat import check as check_heartbeat
from ..queries import q
from ._workers import WorkersRun, workers_run

CLAIM = ("A job that outlives its lease (2 s lease, 3 s job) runs twice; a fenced finish keeps "
         "the late write out of the database but not out of the world; a heartbeat prevents the "
         "second execution, and needs a maximum runtime for a worker that is stuck but alive.")

ARTICLE: dict[str, Any] = {
    "executions": {"lease_only": 2, "fence": 2, "heartbeat": 1, "max_runtime": 2},
    "completions": {"lease_only": 2, "fence": 1, "heartbeat": 1, "max_runtime": 1},
    "setup": "lease 2 s, job 3 s, a second worker polling every 100 ms, heartbeat every 0.5 s",
    "note": ("lease_only, fence, heartbeat: measured in the article. max_runtime: the article's "
             "argument (a stuck worker needs a maximum runtime, the fence stays the last "
             "defence), not a measurement; the outcome shown is what that argument predicts."),
}

#: Beyond the article's four: the stuck worker without a maximum runtime, never taken over.
EXPECTED_STUCK = {"executions": 1, "completions": 1}

WORKERS = ("worker-a", "worker-b")
SEGMENT_COLUMNS = ["kind", "worker", "attempt", "start", "end", "outcome", "label"]
VERDICTS = {(1, 1): "one execution", (2, 2): "ran twice",
            (2, 1): "fenced: one write, two executions"}


class OverrunError(RuntimeError):
    """The overrun experiment could not run as set up."""


@dataclass(frozen=True)
class Settings:
    """The knobs, in seconds. ``hang``: how long a stuck first attempt hangs after its work."""

    lease: float = 2.0
    job: float = 3.0
    poll: float = 0.1
    heartbeat: float = 0.5
    max_runtime: float = 4.0
    hang: float = 5.0

    def __post_init__(self) -> None:
        for name in ("lease", "poll", "heartbeat", "max_runtime"):
            if not getattr(self, name) > 0:
                raise OverrunError(f"{name} must be a positive number of seconds, "
                                   f"not {getattr(self, name)!r}")
        if self.job < 0 or self.hang < 0:
            raise OverrunError("job and hang must be 0 or more seconds")


@dataclass(frozen=True)
class Variant:
    """What the workers run with: fenced finish, heartbeat, maximum runtime; a stuck job or not."""

    name: str
    label: str
    fence: bool = True
    heartbeat: bool = False
    max_runtime: bool = False
    stuck: bool = False

    def worker_options(self, s: Settings) -> dict[str, Any]:
        """Return the worker command's options for these settings."""
        if self.max_runtime and not self.heartbeat:
            raise OverrunError("a maximum runtime needs the heartbeat switched on")
        check_heartbeat(s.lease, s.heartbeat if self.heartbeat else None,
                        s.max_runtime if self.max_runtime else None)
        return {"design": "leased", "lease": s.lease, "poll": s.poll, "max_jobs": 1,
                "fence": self.fence,
                "heartbeat": s.heartbeat if self.heartbeat else None,
                "max_runtime": s.max_runtime if self.max_runtime else None}


VARIANTS = (
    Variant("lease_only", "lease only (no fence, no heartbeat)", fence=False),
    Variant("fence", "lease + fenced finish"),
    Variant("heartbeat", "lease + fence + heartbeat", heartbeat=True),
    Variant("stuck", "heartbeat, stuck job, no maximum runtime", heartbeat=True, stuck=True),
    Variant("max_runtime", "heartbeat + maximum runtime, stuck job", heartbeat=True,
            max_runtime=True, stuck=True),
)
BY_NAME = {v.name: v for v in VARIANTS}


class Result(NamedTuple):
    table: pd.DataFrame  # one row per variant
    summary: dict[str, Any]
    events: pd.DataFrame  # every worker event, with a ``variant`` column
    segments: pd.DataFrame  # the Gantt rows of each variant (see ``segments``), ``variant`` column


def variant(name: str | Variant) -> Variant:
    """Return the variant called `name`; say which exist when it does not."""
    if isinstance(name, Variant):
        return name
    try:
        return BY_NAME[name]
    except KeyError:
        raise OverrunError(f"unknown variant {name!r}; valid: {', '.join(BY_NAME)}") from None


def verdict_of(executions: int, completions: int) -> str:
    """Return the outcome in words: ran twice, fenced, or one execution."""
    return VERDICTS.get((executions, completions),
                        f"{executions} executions, {completions} completions")


def expect(v: Variant, s: Settings, margin: float = 0.5) -> tuple[str | None, str]:
    """Return (expected verdict, why) for a variant and settings; None when too close to call.

    The first attempt runs ``job`` (+ ``hang`` when stuck). Without a heartbeat its lease ends at
    ``lease``; with one it never ends while the job runs, unless a maximum runtime stops the
    beats: then it ends between ``max_runtime - heartbeat + lease`` and ``max_runtime + lease``.
    The other worker claims within ``poll`` of the end. ``margin``: seconds of scheduling noise.
    """
    first = s.job + (s.hang if v.stuck else 0.0)
    if v.heartbeat and not (v.max_runtime and first > s.max_runtime):
        if v.max_runtime and abs(first - s.max_runtime) < margin:
            return None, (f"the first attempt ({first:g} s) ends about when the maximum runtime "
                          f"({s.max_runtime:g} s) stops the heartbeat")
        return "one execution", (f"the heartbeat keeps the lease while the first attempt runs "
                                 f"({first:g} s)")
    if v.heartbeat:
        earliest = s.max_runtime - s.heartbeat + s.lease
        latest = s.max_runtime + s.lease + s.poll
        why = (f"abandoned at {s.max_runtime:g} s, lease ends by {latest - s.poll:g} s, "
               f"the first attempt runs {first:g} s")
    else:
        earliest, latest = s.lease, s.lease + s.poll
        why = f"the lease ends at {s.lease:g} s, the first attempt runs {first:g} s"
    if first < earliest - margin:
        return "one execution", why + ": it finishes first"
    if first > latest + margin:
        outcome = VERDICTS[(2, 1)] if v.fence else VERDICTS[(2, 2)]
        return outcome, why + ": the other worker takes it over while it runs"
    return None, why + ": too close to call, scheduling decides"


def _facts(run: WorkersRun, job: int, outside_file: Any) -> dict[str, Any]:
    calls = [c for c in outside.read(outside_file) if c["job"] == job]
    with run.scratch.connect("worker", "overrun check", autocommit=True) as conn:
        runs = conn.execute(q("job_runs_of"), {"id": job}).fetchall()
        state = next(s for s in queue.job_states(conn) if s["id"] == job)
    ev = event_log.read(run.path)
    claims = [e for e in ev if e["event"] == "claim"]
    return {
        "executions": len(calls),
        "completions": sum(1 for r in runs if r[3] is not None),
        "db_runs": len(runs),
        "outside": [f"{c['worker']} attempt {c['attempt']}" for c in calls],
        "status": state["status"], "attempts": state["attempts"],
        "claims": len(claims),
        "first_worker": min(claims, key=lambda e: e["t"])["worker"] if claims else None,
        "beats": sum(1 for e in ev if e["event"] == "heartbeat"),
        "abandoned": sum(1 for e in ev if e["event"] == "abandon"),
        "fenced": sum(1 for e in ev if e["event"] == "fenced"),
        "lease_lost": sum(1 for e in ev if e["event"] == "lease-lost"),
        "taken_over": any(e.get("attempt", 0) >= 2 for e in claims),
        "overlap_s": round(_overlap(ev), 2),
    }


def _overlap(ev: list[dict[str, Any]]) -> float:
    """Return the seconds during which two executions ran at once."""
    spans, start = [], {}
    for e in ev:
        if e["event"] == "execute":
            start[e["worker"]] = e["t"]
        elif e["event"] in ("finish", "fenced", "fail", "crash") and e["worker"] in start:
            spans.append((start.pop(e["worker"]), e["t"]))
    total = 0.0
    for i, (a0, a1) in enumerate(spans):
        for b0, b1 in spans[i + 1:]:
            total += max(0.0, min(a1, b1) - max(a0, b0))
    return total


def _limit(s: Settings) -> float:
    return 2 * s.job + s.hang + s.lease + s.max_runtime + 30.0


def segments(ev: list[dict[str, Any]], *, t0: float, now: float) -> pd.DataFrame:
    """Return the Gantt rows of one run: lease windows, executions, overlaps and marks.

    One row per thing drawn: ``kind`` (lease, execution, overlap, or a mark: claim, heartbeat,
    stuck, abandon, expired, lease-lost, outside, finish, fenced), ``worker``, ``attempt``,
    ``start`` and ``end`` in seconds since ``t0`` (the job was queued), ``outcome`` of an
    execution (done, fenced, running) and a ``label``. A running execution ends at ``now``.
    """
    lease = {e["worker"]: e.get("lease") for e in ev if e["event"] == "worker-start"}
    rows: list[dict[str, Any]] = []
    execs: dict[tuple[str, Any], dict[str, Any]] = {}
    until: dict[tuple[str, Any], float] = {}
    claimed: dict[tuple[str, Any], float] = {}

    def mark(e: dict[str, Any], kind: str, label: str, t: float | None = None) -> None:
        at = (e["t"] if t is None else t) - t0
        rows.append({"kind": kind, "worker": e["worker"], "attempt": e.get("attempt"),
                     "start": at, "end": at, "outcome": None, "label": label})

    for e in ev:
        key = (e["worker"], e.get("attempt"))
        kind = e["event"]
        if kind == "claim":
            claimed[key] = e["t"]
            mark(e, "claim", f"claims attempt {e['attempt']}")
        elif kind == "execute":
            execs[key] = {"start": e["t"], "end": None, "outcome": "running"}
        elif kind == "heartbeat":
            until[key] = max(until.get(key, 0.0), e["until"])
            mark(e, "heartbeat", f"heartbeat: lease until +{e['until'] - t0:.1f} s")
        elif kind in ("finish", "fenced") and key in execs:
            execs[key].update(end=e["t"], outcome="done" if kind == "finish" else "fenced")
            mark(e, kind, "finished: its write committed" if kind == "finish"
                 else "fenced: its finish hit no row, rolled back")
        elif kind == "outside":
            mark(e, "outside", "called the outside world (cannot be rolled back)")
        elif kind == "stuck":
            mark(e, "stuck", f"stuck: the call hangs {e['seconds']:g} s")
        elif kind == "abandon":
            mark(e, "abandon", f"maximum runtime ({e['max_runtime']:g} s): heartbeat stops")
        elif kind == "lease-lost":
            mark(e, "lease-lost", "heartbeat: lease lost to another attempt")
    spans = []
    for (worker, attempt), x in execs.items():
        end = x["end"] if x["end"] is not None else now
        spans.append((worker, attempt, x["start"], end))
        rows.append({"kind": "execution", "worker": worker, "attempt": attempt,
                     "start": x["start"] - t0, "end": end - t0, "outcome": x["outcome"],
                     "label": f"attempt {attempt}: {x['outcome']}"})
        start, length = claimed.get((worker, attempt), x["start"]), lease.get(worker) or 0.0
        expires = max(start + length, until.get((worker, attempt), 0.0))
        held = min(expires, end) if x["outcome"] == "done" else expires  # done releases it
        rows.append({"kind": "lease", "worker": worker, "attempt": attempt, "start": start - t0,
                     "end": held - t0, "outcome": None, "label": f"lease of attempt {attempt}"})
        if expires < end:
            mark({"worker": worker, "attempt": attempt, "t": expires}, "expired",
                 f"lease of attempt {attempt} expired while it ran")
    for i, (w1, a1, s1, e1) in enumerate(spans):
        for w2, a2, s2, e2 in spans[i + 1:]:
            lo, hi = max(s1, s2), min(e1, e2)
            if hi > lo:
                for w, a in ((w1, a1), (w2, a2)):
                    rows.append({"kind": "overlap", "worker": w, "attempt": a, "start": lo - t0,
                                 "end": hi - t0, "outcome": None,
                                 "label": f"two executions at once for {hi - lo:.1f} s"})
    return pd.DataFrame(rows, columns=SEGMENT_COLUMNS)


def run_variant(run: WorkersRun, v: Variant, s: Settings, live: Any = None) -> dict[str, Any]:
    """Start two workers, queue one job once both poll, wait until it is settled; return facts.

    ``live.update(segments)`` is called every 0.2 s while the job runs, and once at the end.
    """
    options = v.worker_options(s)
    outside_file = run.path.with_name("outside.jsonl")
    run.fleet.env[outside.FILE_ENV] = str(outside_file)
    run.fleet.env[outside.HANG_ENV] = str(s.hang if v.stuck else 0)
    procs = {name: run.start(name=name, **options) for name in WORKERS}

    def polling() -> bool:
        for name, p in procs.items():
            if p.poll() is not None:
                raise OverrunError(f"{name} exited ({p.returncode}) before the job was queued")
        idle = {e["worker"] for e in event_log.read(run.path) if e["event"] == "idle"}
        return idle >= set(WORKERS)

    run.until(polling, timeout=30)
    t0 = time.time()

    def draw() -> None:
        if live is not None:
            live.update(segments(event_log.read(run.path), t0=t0, now=time.time()))

    with run.scratch.connect("worker", "overrun enqueue", autocommit=True) as conn:
        (job,) = queue.enqueue(conn, "outside", tenant=1, seconds=s.job)

        def settled() -> bool:
            draw()
            claimed = {e["worker"] for e in event_log.read(run.path) if e["event"] == "claim"}
            running = [n for n in claimed if procs[n].poll() is None]
            if all(p.poll() is not None for p in procs.values()):
                return True
            status = next(x["status"] for x in queue.job_states(conn) if x["id"] == job)
            return status in ("done", "dead") and not running

        run.until(settled, timeout=_limit(s))
    draw()
    final = segments(event_log.read(run.path), t0=t0, now=time.time())
    return {**_facts(run, job, outside_file), "segments": final}


def run(*, full: bool = False, progress: Any = None, live: Any = None,
        variants: tuple[str | Variant, ...] | list[str | Variant] = VARIANTS,
        settings: Settings | None = None, **knobs: float) -> Result:
    """Run each variant with two real worker processes; return one row per variant.

    ``knobs``: lease, job, poll, heartbeat, max_runtime, hang (seconds; defaults are the
    article's setup), or all of them at once as ``settings``. ``live``: ``live.update(segments)``
    redraws a chart while a variant runs (``tenantlab.charts.overrun.chart`` draws them).
    ``full`` changes nothing: the article's experiment is already this size.
    """
    s = settings if settings is not None else Settings(**knobs)
    chosen = [variant(v) for v in variants]
    for v in chosen:
        v.worker_options(s)  # refuse bad settings before any process starts
    rows, frames, gantt = [], [], []
    for v in chosen:
        # The live chart is drawn here, from the Gantt rows, not from the generic timeline.
        with workers_run(f"overrun {v.name}") as r:
            facts = run_variant(r, v, s, live)
            ev = r.events()
        gantt.append(facts.pop("segments").assign(variant=v.name))
        verdict = verdict_of(facts["executions"], facts["completions"])
        expected, why = expect(v, s)
        rows.append({"variant": v.name, "label": v.label, **facts, "verdict": verdict,
                     "expected": expected, "why": why,
                     "as_expected": None if expected is None else verdict == expected})
        frames.append(ev.assign(variant=v.name))
        if progress:
            progress(1)
    table = pd.DataFrame(rows)
    summary = {
        "executions": dict(zip(table.variant, table.executions.astype(int), strict=True)),
        "completions": dict(zip(table.variant, table.completions.astype(int), strict=True)),
        "verdicts": dict(zip(table.variant, table.verdict, strict=True)),
        "settings": asdict(s),
    }
    events = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    segs = pd.concat(gantt, ignore_index=True) if gantt else pd.DataFrame(columns=SEGMENT_COLUMNS)
    return Result(table, summary, events, segs)


def expected_counts(name: str) -> dict[str, int] | None:
    """Return the article's executions and completions for a variant (None if it has none)."""
    if name == "stuck":
        return EXPECTED_STUCK
    if name in ARTICLE["executions"]:
        return {k: ARTICLE[k][name] for k in ("executions", "completions")}
    return None


def check(table: pd.DataFrame) -> dict[str, bool]:
    """Return, per variant run, whether executions and completions are the article's."""
    out = {}
    for r in table.itertuples():
        want = expected_counts(r.variant)
        if want is not None:
            ok = r.executions == want["executions"] and r.completions == want["completions"]
            if r.variant == "max_runtime":
                ok = ok and r.abandoned >= 1 and bool(r.taken_over) and r.fenced >= 1
            if r.variant == "stuck":
                ok = ok and not r.taken_over and r.beats > 0
            out[r.variant] = bool(ok)
    return out


def describe(r: Any) -> str:
    """Return one variant's outcome in a line."""
    extra = []
    if r.beats:
        extra.append(f"{r.beats} beats")
    if r.abandoned:
        extra.append("abandoned")
    if r.taken_over:
        extra.append("taken over")
    if r.fenced:
        extra.append(f"{r.fenced} fenced")
    more = f" ({', '.join(extra)})" if extra else ""
    return f"{r.variant}: {r.executions} executions, {r.completions} completions{more}"


def reproduce(full: bool = False) -> dict[str, Any]:
    """Run the five variants at the article's setup and compare the counts."""
    res = run(full=full)
    t = res.table
    agree = check(t)
    measured = {
        "executions": res.summary["executions"],
        "completions": res.summary["completions"],
        "verdicts": res.summary["verdicts"],
        "beats": dict(zip(t.variant, t.beats.astype(int), strict=True)),
        "abandoned": dict(zip(t.variant, t.abandoned.astype(int), strict=True)),
        "taken_over": dict(zip(t.variant, t.taken_over.astype(bool), strict=True)),
        "overlap_s": dict(zip(t.variant, t.overlap_s.astype(float), strict=True)),
        "settings": res.summary["settings"],
        "as_article": agree,
    }
    summary = "; ".join(describe(r) for r in t.itertuples())
    return {"measured": measured, "reproduced": all(agree.values()) and len(agree) == 5,
            "summary": summary}


__all__ = ["ARTICLE", "CLAIM", "VARIANTS", "Result", "Settings", "Variant", "expect", "reproduce",
           "run", "verdict_of"]
