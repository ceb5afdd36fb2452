"""Finding ``poison``: in the single-transaction queue a failing job is never counted.

One job that always fails (``select 1/0``) with a normal job behind it; one worker process
fetches up to ten times. Without an error handler the rollback takes the attempt count and
the ``job_runs`` row with it, and the poison job is first in line again, every time. With a
handler that counts the attempt in a new transaction the job is dead after max_attempts and
the queue moves on; the leased design counts at the claim and retries after a backoff.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from .. import finding, queue
from ..finding import Result, Verdict, check, knob, plain
from ..queries import q
from ._workers import WorkersRun, workers_run

CLAIM = ("In the single-transaction queue a job that always fails is picked 10 of 10 times and "
         "never counted (even its job_runs row rolls back), and the job behind it never runs; "
         "an error handler counting in a new transaction makes it dead after 3.")

ARTICLE: dict[str, Any] = {
    "unhandled": {"picked": 10, "attempts": 0, "job_runs": 0, "next_job_ran": False},
    "handled": {"status": "dead", "attempts": 3, "next_job_ran": True},
    "setup": "one poison job (select 1/0) first, a normal job behind it, one worker, 10 fetches",
}

POISON, NEXT = 1, 2  # job ids after reset_queue: the poison job first, the normal one behind


@dataclass(frozen=True)
class Variant:
    name: str
    design: str
    handle_errors: bool
    label: str


VARIANTS = {
    "unhandled": Variant("unhandled", "single", False, "single transaction, no error handler"),
    "handled": Variant("handled", "single", True,
                       "single transaction, handler counts in a new transaction"),
    "leased": Variant("leased", "leased", False, "leased: counted at the claim, fenced failure"),
}


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """One worker fetches up to `fetches` times; the article's setup is already this small."""

    fetches: int = knob(10, lo=3, hi=20, label="fetches")
    max_attempts: int = knob(3, lo=1, hi=6, label="max attempts")
    backoff: bool = knob(True, label="backoff (leased)")
    variants: tuple[str, ...] = knob(("unhandled", "handled", "leased"))


def run_variant(run: WorkersRun, variant: Variant, *, fetches: int, max_attempts: int,
                backoff: float, timeout: float = 60.0) -> dict[str, Any]:
    """Queue the poison job and one behind it; let one worker fetch up to `fetches` times."""
    with run.scratch.connect("admin", "poison reset", autocommit=True) as admin:
        admin.execute(q("reset_queue"))
    with run.scratch.connect("worker", "poison watch", autocommit=True) as conn:
        queue.enqueue(conn, "fail", tenant=1, max_attempts=max_attempts)
        queue.enqueue(conn, "count", tenant=2, max_attempts=max_attempts)
        proc = run.start(design=variant.design, name=variant.name,
                         handle_errors=variant.handle_errors, max_jobs=fetches, poll=0.05,
                         lease=30.0, backoff=backoff)

        def settled() -> bool:
            states = queue.job_states(conn)
            return proc.poll() is not None or all(s["status"] in ("done", "dead") for s in states)

        run.until(settled, timeout)
        run.stop(proc)  # it may be polling an empty queue: stop after its current job
        states = {s["id"]: s for s in queue.job_states(conn)}
    ev = run.events()
    mine = ev[(ev["worker"] == variant.name)]
    poison, nxt = states[POISON], states[NEXT]
    return {
        "variant": variant.name, "label": variant.label,
        "picked": int(((mine["event"] == "claim") & (mine["job"] == POISON)).sum()),
        "attempts": poison["attempts"], "job_runs": poison["runs"], "status": poison["status"],
        "next_job_ran": nxt["status"] == "done", "next_job_runs": nxt["runs"],
        "fetches": fetches, "max_attempts": max_attempts,
    }


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Run each variant with one real worker process; return per-variant rows and events.

    ``backoff`` spaces the leased design's retries (0.2 s doubling).
    """
    k = knobs or Knobs.sized()
    unknown = [v for v in k.variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant {unknown[0]!r}; valid: {', '.join(VARIANTS)}")
    if not 1 <= k.max_attempts <= 20 or k.fetches < 1:
        raise ValueError("max_attempts must be 1..20 and fetches at least 1")
    rows = []
    with workers_run("poison", live) as r:
        for name in k.variants:
            rows.append(run_variant(r, VARIANTS[name], fetches=k.fetches,
                                    max_attempts=k.max_attempts,
                                    backoff=0.2 if k.backoff else 0.0))
            if progress:
                progress(1)
        ev = r.events()
    table = pd.DataFrame(rows).set_index("variant")
    measured = {row["variant"]: {key: plain(v) for key, v in row.items()
                                 if key not in ("variant", "label")} for row in rows}
    verdict = judge(measured, k)
    return Result("poison", k, measured, verdict, table=table,
                  events=ev)


def script(events: pd.DataFrame, variant: str) -> pd.DataFrame:
    """Return the interleaved script of one variant: who did what, and what was seen."""
    words = {"claim": "claims", "execute": "starts", "finish": "finishes",
             "fail": "fails", "dead": "marks dead", "idle": "finds the queue empty"}
    d = events[(events["worker"] == variant) & events["event"].isin(list(words))]
    lines = []
    for r in d.itertuples():
        what = "poison job" if r.job == POISON else "job behind it" if r.job == NEXT else ""
        seen = ""
        if r.event == "fail":
            seen = "attempt counted" if getattr(r, "counted", False) is True else \
                "rolled back: attempt and job_runs row gone"
        lines.append({"t (s)": round(r.t, 2), "who": f"worker {variant}",
                      "does": f"{words[r.event]} {what}".strip(),
                      "attempt": "" if pd.isna(r.attempt) else int(r.attempt), "seen": seen})
    return pd.DataFrame(lines)


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Judge each variant that ran: unhandled never counted, handled and leased dead at max."""
    k = knobs or Knobs()
    checks = []
    if u := measured.get("unhandled"):
        checks += [
            check("unhandled: picked every fetch", u["picked"] == u["fetches"],
                  f"{u['fetches']} of {u['fetches']}", f"{u['picked']} of {u['fetches']}"),
            check("unhandled: never counted", u["attempts"] == 0 and u["job_runs"] == 0,
                  "attempts 0, job_runs 0",
                  f"attempts {u['attempts']}, job_runs {u['job_runs']}"),
            check("unhandled: the job behind it", not u["next_job_ran"], "never ran",
                  "ran" if u["next_job_ran"] else "never ran"),
        ]
    for name in ("handled", "leased"):
        if h := measured.get(name):
            checks += [
                check(f"{name}: dead after max attempts",
                      h["status"] == "dead" and h["attempts"] == h["max_attempts"],
                      f"dead after {h['max_attempts']}", f"{h['status']} after {h['attempts']}"),
                check(f"{name}: the job behind it", h["next_job_ran"], "ran",
                      "ran" if h["next_job_ran"] else "never ran"),
            ]
    return Verdict.of(checks, article=k.is_article_setup())
