"""Finding ``overrun``: a job outlives its lease and a second worker takes it over while it runs.

Two leased worker processes, worker A and worker B, one job each (``--max-jobs 1``), both
polling an empty queue every ``poll`` seconds; then one ``outside`` job (tenantlab/outside.py)
is queued: it works for ``job`` seconds and then calls the outside world, which appends a line
to a file no transaction can roll back. Worker A claims it (the run holds worker B back for
that moment: the article's script); worker B keeps polling. Per variant we count the
**executions** (lines the outside world received) and the **completions** (the job's
``job_runs`` rows that finished: a fenced execution's row rolls back with its work).

Variants (the article's setup: lease 2 s, job 3 s, polling every 100 ms, heartbeat 0.5 s):

- ``lease_only``: no fence, no heartbeat: both execute, both finish (the job ran twice);
- ``fence``: the late finish hits no row and rolls back, but both did the work;
- ``heartbeat``: the lease is extended while the job runs: one execution;
- ``stuck``: the first attempt hangs (stuck but alive) and keeps beating: never taken over;
- ``max_runtime``: the same stuck attempt, abandoned at the maximum runtime: its lease runs out,
  the other worker takes the job over and completes it, the stuck worker's late finish is fenced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from .. import finding
from ..finding import Result, Verdict, check, knob, plain
from ..queue import check_heartbeat
from ._gantt import COLUMNS as SEGMENT_COLUMNS
from ._gantt import segments
from ._race import WORKERS, OverrunError, race
from ._workers import workers_run

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

VERDICTS = {(1, 1): "one execution", (2, 2): "ran twice",
            (2, 1): "fenced: one write, two executions"}
SECONDS = ("lease", "job", "poll", "heartbeat", "max_runtime", "hang")


@dataclass(frozen=True)
class Variant:
    """What the workers run with: fenced finish, heartbeat, maximum runtime; a stuck job or not."""

    name: str
    label: str
    fence: bool = True
    heartbeat: bool = False
    max_runtime: bool = False
    stuck: bool = False
    title: str = ""  # short name in a verdict's check (default: the label)

    def worker_options(self, s: Knobs) -> dict[str, Any]:
        """Return the worker command's options for these knobs."""
        if self.max_runtime and not self.heartbeat:
            raise OverrunError("a maximum runtime needs the heartbeat switched on")
        check_heartbeat(s.lease, s.heartbeat if self.heartbeat else None,
                        s.max_runtime if self.max_runtime else None)
        return {"design": "leased", "lease": s.lease, "poll": s.poll, "max_jobs": 1,
                "fence": self.fence,
                "heartbeat": s.heartbeat if self.heartbeat else None,
                "max_runtime": s.max_runtime if self.max_runtime else None}


VARIANTS = (
    Variant("lease_only", "lease only (no fence, no heartbeat)", fence=False, title="lease only"),
    Variant("fence", "lease + fenced finish", title="fenced finish"),
    Variant("heartbeat", "lease + fence + heartbeat", heartbeat=True, title="heartbeat"),
    Variant("stuck", "heartbeat, stuck job, no maximum runtime", heartbeat=True, stuck=True,
            title="stuck, no maximum runtime"),
    Variant("max_runtime", "heartbeat + maximum runtime, stuck job", heartbeat=True,
            max_runtime=True, stuck=True, title="stuck, maximum runtime"),
)
BY_NAME = {v.name: v for v in VARIANTS}


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """The article's setup, in seconds; ``hang``: how long a stuck first attempt hangs.

    ``variants``: names from ``VARIANTS``, or ``Variant`` objects (the explorer's switches).
    The article's experiment is already this size: ``full()`` is the same.
    """

    lease: float = knob(2.0, lo=0.5, hi=6, step=0.25, label="lease (s)")
    heartbeat: float = knob(0.5, lo=0.1, hi=4, step=0.1, label="heartbeat every (s)")
    job: float = knob(3.0, lo=0.5, hi=8, step=0.25, label="job duration (s)")
    poll: float = knob(0.1, lo=0.05, hi=2, step=0.05, label="poll every (s)")
    max_runtime: float = knob(4.0, lo=1, hi=12, step=0.5, label="max runtime (s)")
    hang: float = knob(5.0, lo=0.5, hi=10, step=0.5, label="stuck for (s)")
    variants: tuple[str | Variant, ...] = knob(tuple(BY_NAME))

    def __post_init__(self) -> None:
        for name in ("lease", "poll", "heartbeat", "max_runtime"):
            if not getattr(self, name) > 0:
                raise OverrunError(f"{name} must be a positive number of seconds, "
                                   f"not {getattr(self, name)!r}")
        if self.job < 0 or self.hang < 0:
            raise OverrunError("job and hang must be 0 or more seconds")

    def seconds(self) -> dict[str, float]:
        """Return the six durations (``reproduce --json``'s ``settings``)."""
        return {name: getattr(self, name) for name in SECONDS}

    def chosen(self) -> list[Variant]:
        return [variant(v) for v in self.variants]


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


def expect(v: Variant, s: Knobs, margin: float = 0.5) -> tuple[str | None, str]:
    """Return (expected verdict, why) for a variant and knobs; None when too close to call.

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


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Run each variant with two real worker processes; return one table row per variant.

    ``live``: ``live.update(segments)`` redraws a chart while a variant runs
    (``tenantlab.charts.overrun.chart`` draws them). ``data["segments"]``: every variant's
    Gantt rows, with a ``variant`` column, as are the events.
    """
    k = knobs or Knobs.sized()
    chosen = k.chosen()
    for v in chosen:
        v.worker_options(k)  # refuse bad knobs before any process starts
    rows, frames, gantt = [], [], []
    for v in chosen:
        # The live chart is drawn here, from the Gantt rows, not from the generic timeline.
        with workers_run(f"overrun {v.name}") as r:
            facts = race(r, v.worker_options(k), job=k.job, hang=k.hang if v.stuck else 0.0,
                         timeout=2 * k.job + k.hang + k.lease + k.max_runtime + 30.0, live=live)
            ev = r.events()
        gantt.append(facts.pop("segments").assign(variant=v.name))
        outcome = verdict_of(facts["executions"], facts["completions"])
        expected, why = expect(v, k)
        rows.append({"variant": v.name, "label": v.label, **facts, "verdict": outcome,
                     "expected": expected, "why": why,
                     "as_expected": None if expected is None else outcome == expected})
        frames.append(ev.assign(variant=v.name))
        if progress:
            progress(1)
    segs = pd.concat(gantt, ignore_index=True) if gantt else \
        pd.DataFrame(columns=[*SEGMENT_COLUMNS, "variant"])
    return _result(k, pd.DataFrame(rows),
                   pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(), segs)


def combine(results: Sequence[Result]) -> Result:
    """Return runs of single variants (the notebook's sections) as one result, judged once.

    They must share the same durations; five runs of the article's variants at the article's
    setup are judged against the article.
    """
    if not results:
        raise OverrunError("nothing to combine: no run given")
    knobs = [r.knobs for r in results if isinstance(r.knobs, Knobs)]
    if len(knobs) < len(results) or any(x.seconds() != knobs[0].seconds() for x in knobs):
        raise OverrunError("only overrun runs with the same durations can be judged together")
    k = dataclasses.replace(knobs[0], variants=tuple(v for x in knobs for v in x.variants))
    table = pd.concat([r.table for r in results], ignore_index=True)
    events = pd.concat([r.events for r in results], ignore_index=True)
    segs = pd.concat([r.data["segments"] for r in results], ignore_index=True)
    return _result(k, table, events, segs)


def _result(k: Knobs, table: pd.DataFrame, events: pd.DataFrame, segs: pd.DataFrame) -> Result:
    def per_variant(column: str, kind: type) -> dict[str, Any]:
        return {v: None if x is None else plain(kind(x))
                for v, x in zip(table.variant, table[column], strict=True)}

    measured: dict[str, Any] = {
        "executions": per_variant("executions", int),
        "completions": per_variant("completions", int),
        "verdicts": per_variant("verdict", str),
        "beats": per_variant("beats", int),
        "abandoned": per_variant("abandoned", int),
        "taken_over": per_variant("taken_over", bool),
        "overlap_s": per_variant("overlap_s", float),
        "fenced": per_variant("fenced", int),
        "first_worker": per_variant("first_worker", str),
        "settings": k.seconds(),
    }
    measured["as_article"] = {v: _as_article(v, measured) for v in measured["executions"]
                              if expected_counts(v) is not None}
    return Result("overrun", k, measured, judge(measured, k), table=table,
                  events=events, data={"segments": segs})


def expected_counts(name: str) -> dict[str, int] | None:
    """Return the article's executions and completions for a variant (None if it has none)."""
    if name == "stuck":
        return EXPECTED_STUCK
    if name in ARTICLE["executions"]:
        return {k: ARTICLE[k][name] for k in ("executions", "completions")}
    return None


def _as_article(name: str, m: dict[str, Any]) -> bool:
    """Return whether a variant's counts (and, for the stuck ones, its story) are the article's."""
    want = expected_counts(name)
    if want is None:
        return False
    ok = m["executions"][name] == want["executions"] and m["completions"][name] == want["completions"]
    if name == "max_runtime":
        ok = ok and m["abandoned"][name] >= 1 and m["taken_over"][name] and m["fenced"][name] >= 1
    if name == "stuck":
        ok = ok and not m["taken_over"][name] and m["beats"][name] > 0
    return bool(ok)


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Judge each variant that ran against the article's counts, or elsewhere against ``expect``.

    At the article's durations a named variant's counts (and, for the stuck ones, its story) must
    be the article's; at other durations, or for the explorer's switches, its outcome must be
    the one ``expect`` predicts (either outcome when too close to call). At the article's setup
    all five variants must have run.
    """
    k = knobs or Knobs()
    article_seconds = measured.get("settings", k.seconds()) == Knobs().seconds()
    by_name = {v.name: v for v in k.chosen()}
    checks = []
    for name in measured["executions"]:
        v = by_name.get(name) or variant(name)
        counts = _counts(measured["executions"][name], measured["completions"][name])
        want = expected_counts(name) if article_seconds and name in BY_NAME else None
        if want is not None:
            expected = _counts(want["executions"], want["completions"]) + {
                "max_runtime": "; abandoned, taken over, fenced",
                "stuck": "; beats, never taken over"}.get(name, "")
            got = counts + _story(name, measured)
            checks.append(check(v.title or v.label, _as_article(name, measured), expected, got))
            continue
        outcome, why = expect(v, k)
        possible = {outcome} if outcome else {VERDICTS[(1, 1)],
                                             VERDICTS[(2, 1) if v.fence else (2, 2)]}
        checks.append(check(v.title or v.label, measured["verdicts"][name] in possible,
                            f"{outcome or 'either (too close to call)'}: {why}",
                            f"{measured['verdicts'][name]}: {counts}"))
    if k.is_article_setup():
        missing = [n for n in BY_NAME if n not in measured["executions"]]
        if missing:
            checks.append(check("every variant ran", False, ", ".join(BY_NAME),
                                f"missing: {', '.join(missing)}"))
    return Verdict.of(checks, article=k.is_article_setup())


def _counts(executions: int, completions: int) -> str:
    return (f"{executions} execution{'s' * (executions != 1)}, "
            f"{completions} completion{'s' * (completions != 1)}")


def _story(name: str, m: dict[str, Any]) -> str:
    extra = [f"{m['beats'][name]} beats"] if m["beats"][name] else []
    if m["abandoned"][name]:
        extra.append("abandoned")
    extra.append("taken over" if m["taken_over"][name] else "never taken over")
    if m.get("fenced", {}).get(name):
        extra.append(f"{m['fenced'][name]} fenced")
    return f"; {', '.join(extra)}"


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


__all__ = ["ARTICLE", "BY_NAME", "CLAIM", "EXPECTED_STUCK", "VARIANTS", "VERDICTS", "WORKERS",
           "Knobs", "OverrunError", "Variant", "combine", "describe", "expect", "expected_counts",
           "judge", "run", "segments", "variant", "verdict_of"]
