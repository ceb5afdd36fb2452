"""Finding ``horizon``: the queue slows down, block by block, while another session holds the horizon.

One worker drains N queued jobs one at a time with the article's shortest fetch
(``delete ... where id = (select id ... for update skip locked) returning id``), timing every
fetch; per block we keep the median and the buffers an ``EXPLAIN (ANALYZE, BUFFERS)`` of the
fetch reads at the block's end (in a transaction rolled back, so it fetches nothing). While a
holder keeps a transaction open, no fetched job's index entry may be treated as dead, so every
fetch walks past all of them: the line climbs. Other people's long transactions on the same
server hold the horizon too (it is cluster-wide here): every block records the foreign holders
the monitor saw, and a run waits a little for a clear horizon before it starts.

``run(knobs)`` makes the article's runs (``drain`` each): nobody holding; a holder with an id,
released for one last block; the done-status design, held; a REPEATABLE READ holder.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import psycopg

from .. import db, finding
from ..errors import TenantlabError
from ..finding import Result, Verdict, check, knob, plain
from ..monitor import HOLDER_KINDS, Holder, Monitor
from ..queries import q

log = logging.getLogger("tenantlab")

CLAIM = ("While another session holds a transaction open, a queue's fetch gets slower block by "
         "block in a straight line (0.7 -> 8.3 ms over 100,000 jobs) and is back to 0.69 ms "
         "right after it ends.")
ARTICLE: dict[str, Any] = {
    "jobs": 100_000, "block": 10_000, "variant_jobs": 60_000,
    "held_first_ms": 0.7, "held_last_ms": 8.3,
    "explain_at": 50_000,
    "explain": {"held": {"buffers": 654, "ms": 4.1}, "free": {"buffers": 42, "ms": 0.05}},
    "done_status_last_ms": 8.34, "after_release_ms": 0.69,
    "repeatable_read": "the same line as a transaction with an id",
}

DESIGNS = ("delete", "done")
Watch = Callable[[dict[str, Any]], None]


class HorizonError(TenantlabError, ValueError):
    """Bad parameters for the horizon experiment."""


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """Sizes of the article's runs: one point on the line every `block` jobs.

    The free and held runs drain `jobs`, the done-status and REPEATABLE READ runs
    `variant_jobs`. The workshop size keeps notebook 07 under a minute on two shared cores (a
    held run costs the square of its jobs); blocks of 1,000 keep a dozen points on the line.
    """

    jobs: int = knob(12_000, full=100_000, lo=4_000, hi=100_000, step=2_000, label="jobs")
    block: int = knob(1_000, full=10_000, lo=500, hi=10_000, step=500, label="block")
    variant_jobs: int = knob(10_000, full=60_000, lo=2_000, hi=60_000, step=2_000,
                             label="jobs (other runs)")
    #: seconds a run waits for other sessions' long transactions to end before it starts
    wait_clear: float = knob(15.0)


HOLDER_CHOICES = (("nobody", None), ("a transaction with an id", "xid"),
                  ("REPEATABLE READ reader", "rr"), ("READ COMMITTED reader", "rc"))


@dataclass(frozen=True)
class Drain(finding.Knobs):
    """One run of ``drain``: queue size, block size, who holds the horizon, which fetch."""

    jobs: int = knob(10_000, lo=2_000, hi=60_000, step=2_000, label="jobs")
    block: int = knob(1_000, lo=500, hi=10_000, step=500, label="block")
    holder: str | None = knob("xid", choices=HOLDER_CHOICES, label="holder")
    design: str = knob("delete", choices=DESIGNS, label="fetch")


def _buffers(plan: dict[str, Any]) -> int:
    p = plan["Plan"]
    return int(p.get("Shared Hit Blocks", 0) + p.get("Shared Read Blocks", 0))


def explain_fetch(conn: psycopg.Connection, design: str = "delete") -> dict[str, float]:
    """Return buffers and server ms of one fetch under EXPLAIN ANALYZE, rolled back."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(q(f"horizon_explain_fetch_{design}")).fetchone()
    if row is None:
        raise HorizonError("EXPLAIN returned no plan")
    plan = row[0][0]
    return {"buffers": _buffers(plan), "ms": round(float(plan["Execution Time"]), 3)}


def drain(*, jobs: int = 10_000, block: int = 1_000, holder: str | None = "xid",
          design: str = "delete", release_after: int | None = None,
          watch: Watch | None = None, wait_clear: float = 15.0,
          idle_timeout: float | None = None, dsn: str | None = None
          ) -> tuple[pd.DataFrame, dict]:
    """Drain a queue of ``jobs`` in blocks; return one row per block and a summary.

    holder: None (nobody holds the horizon), "xid", "rr" or "rc" (see ``monitor.Holder``),
    opened after the queue is filled, before the first fetch. release_after: end the holder
    after that many blocks (the next blocks show what release does). idle_timeout: seconds of
    ``idle_in_transaction_session_timeout`` on the holder's own session. watch(row) is called
    after every block with the block's row, the monitor's sample and the run's pids.
    """
    if design not in DESIGNS:
        raise HorizonError(f"design must be one of {', '.join(DESIGNS)}, not {design!r}")
    if holder is not None and holder not in HOLDER_KINDS:
        raise HorizonError(f"holder must be None or one of {', '.join(HOLDER_KINDS)}, "
                           f"not {holder!r}")
    if not 0 < block <= jobs:
        raise HorizonError(f"block must be between 1 and jobs ({jobs}), not {block}")
    fetch = q(f"horizon_fetch_{design}")
    blocks = jobs // block
    rows: list[dict[str, Any]] = []
    hold: Holder | None = None
    with db.scratch("horizon", dsn) as s:
        with s.connect("admin", "horizon setup", autocommit=True) as admin:
            admin.execute(q("horizon_fill_jobs"), {"n": jobs})
            if design == "done":
                admin.execute(q("horizon_create_queued_index"))
            admin.execute(q("horizon_vacuum_analyze_jobs"))
        monitor = Monitor(s.admin)
        fetcher = None
        try:
            foreign_at_start = monitor.wait_for_clear(s.name, wait_clear) if wait_clear else []
            fetcher = s.connect("worker", "fetcher", autocommit=True)
            if holder is not None:
                hold = Holder(s.worker, holder, idle_timeout=idle_timeout).open()
            explain_fetch(fetcher, design)  # the first one also reads the catalog: not counted
            start = explain_fetch(fetcher, design)
            done = 0
            for b in range(blocks):
                times = []
                for _ in range(block):
                    t0 = time.perf_counter()
                    got = fetcher.execute(fetch).fetchone()
                    times.append((time.perf_counter() - t0) * 1000)
                    if got is None:
                        raise HorizonError(f"queue empty after {done} fetches, expected {jobs}")
                    done += 1
                held = hold is not None and hold.alive()
                ex = explain_fetch(fetcher, design)
                sample = monitor.sample(fetch_ms=statistics.median(times))
                foreign = sample.foreign(s.name)
                row = {
                    "block": b + 1, "jobs_done": done, "held": held,
                    "median_ms": round(statistics.median(times), 3),
                    "p90_ms": round(float(np.percentile(times, 90)), 3),
                    "buffers": ex["buffers"], "explain_ms": ex["ms"],
                    "n_dead_tup": sample.tuples.get("n_dead_tup"),
                    "holder_pid": hold.pid if held and hold else None,
                    "foreign_holders": len(foreign),
                }
                rows.append(row)
                if watch is not None:
                    pids = [fetcher.info.backend_pid, monitor.conn.info.backend_pid,
                            hold.pid if hold else None]
                    watch(dict(row, sample=sample, pids=[p for p in pids if p]))
                if hold is not None and release_after is not None and b + 1 == release_after:
                    hold.release()
        finally:
            # Order matters: end the holder first, so nothing waits on a held horizon.
            if hold is not None:
                hold.release()
            if fetcher is not None:
                fetcher.close()
            monitor.close()
    df = pd.DataFrame(rows)
    summary = {
        "jobs": jobs, "block": block, "design": design, "holder": holder,
        "explain_start": start, "ended_by_timeout": bool(hold and hold.ended_by_timeout),
        "foreign_at_start": foreign_at_start,
        "foreign_blocks": int((df["foreign_holders"] > 0).sum()) if len(df) else 0,
    }
    return df, summary


def slope(df: pd.DataFrame, column: str = "median_ms") -> float:
    """Return the column's growth per 10,000 fetched jobs (least squares; ms by default)."""
    if len(df) < 2:
        return 0.0
    return float(np.polyfit(df["jobs_done"], df[column], 1)[0] * 10_000)


#: Student's t at 97.5 % by degrees of freedom (a 95 % two-sided bound); 1.96 beyond 30.
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
        10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11,
        18: 2.10, 19: 2.09, 20: 2.09, 25: 2.06, 30: 2.04}


def slope_ci(df: pd.DataFrame) -> list[float | None]:
    """Return the 95 % bounds of the median fetch time's slope (ms per 10,000 jobs).

    The blocks' scatter around the line is the noise a shared machine adds: a slope is told
    apart from another only when their bounds do not overlap. Below 3 blocks: no bounds.
    """
    n = len(df)
    if n < 3:
        return [None, None]
    x = df["jobs_done"].to_numpy(float) / 10_000
    y = df["median_ms"].to_numpy(float)
    b, a = np.polyfit(x, y, 1)
    se = float(np.sqrt(((y - (a + b * x)) ** 2).sum() / (n - 2) / ((x - x.mean()) ** 2).sum()))
    t = 1.96 if n - 2 > 30 else T975[max(d for d in T975 if d <= n - 2)]
    return [round(float(b) - t * se, 4), round(float(b) + t * se, 4)]


def _growth(df: pd.DataFrame) -> float:
    return round(float(df["median_ms"].iloc[-1] / df["median_ms"].iloc[0]), 2)


def _half(df: pd.DataFrame, jobs: int) -> dict[str, float]:
    row = df.loc[(df["jobs_done"] - jobs // 2).abs().idxmin()]
    return {"buffers": int(row["buffers"]), "ms": float(row["explain_ms"]),
            "at_jobs": int(row["jobs_done"])}


TRIES = 3  # runs of a variant that other sessions disturbed, at most


def _disturbed(name: str, df: pd.DataFrame) -> bool:
    if name == "free":
        return bool((df["foreign_holders"] > 0).any())
    if name in ("held", "release"):  # the block after the release must be free of others
        return bool(df["foreign_holders"].iloc[-1] > 0)
    return False


def _plan(k: Knobs) -> dict[str, dict[str, Any]]:
    """Return the article's runs; the held run releases its holder for one last block."""
    n = max(k.block, k.jobs // k.block * k.block)
    short = max(k.block, k.variant_jobs // k.block * k.block)
    return {
        "free": {"jobs": n, "holder": None},
        "held": {"jobs": n + k.block, "holder": "xid", "release_after": n // k.block},
        "done_status": {"jobs": short, "holder": "xid", "design": "done"},
        "repeatable_read": {"jobs": short, "holder": "rr"},
    }


def blocks(knobs: Knobs) -> int:
    """Return how many blocks ``run(knobs)`` measures (a progress bar's total)."""
    return sum(p["jobs"] // knobs.block for p in _plan(knobs).values())


def runs(knobs: Knobs, step: Callable[[dict[str, Any], str], None] | None = None
         ) -> dict[str, pd.DataFrame]:
    """Drain the queue once per run of the article; return each run's blocks.

    ``release`` is the held run whole (its last block after the release), ``held`` its held
    blocks. A run that other sessions' transactions disturbed where ours must not (the free
    run, the block after the release) is measured again, at most ``TRIES`` times.
    """
    out: dict[str, pd.DataFrame] = {}
    for name, params in _plan(knobs).items():
        def watch(row: dict[str, Any], name: str = name) -> None:
            if step is not None:
                step(row, name)
        for attempt in range(1, TRIES + 1):
            df, summary = drain(block=knobs.block, watch=watch, wait_clear=knobs.wait_clear,
                                **params)
            if not _disturbed(name, df) or attempt == TRIES:
                break
            log.warning("%s run disturbed by other sessions' transactions; run %d of %d",
                        name, attempt + 1, TRIES)
        df = df.assign(variant=name)
        df.attrs.update(summary, tries=attempt)
        if name == "held":
            out["held"] = df[df["block"] <= params["release_after"]].copy()
            out["held"].attrs.update(df.attrs)
            out["release"] = df
        else:
            out[name] = df
    # The article's order: free, held, done status, REPEATABLE READ, release.
    return {key: out[key] for key in ("free", "held", "done_status", "repeatable_read",
                                      "release")}


#: Free slopes flatter than this (ms per 10,000 jobs) count as flat when taking the ratio.
FLAT = 0.01


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Run the article's runs and judge shape and ratios, not absolute milliseconds.

    ``live.update(frame, sample=...)`` gets every block's rows so far (the finding contract's
    one live protocol) with the monitor's sample of the latest block, and ``progress(1)`` is
    called per block.
    """
    k = knobs or Knobs.sized()
    if not 0 < k.block <= min(k.jobs, k.variant_jobs):
        raise HorizonError(f"block must be between 1 and the jobs of every run, not {k.block}")

    rows: list[dict[str, Any]] = []

    def step(row: dict[str, Any], name: str) -> None:
        if live is not None:
            rows.append({key: v for key, v in row.items() if key not in ("sample", "pids")}
                        | {"variant": name})
            live.update(pd.DataFrame(rows), sample=row.get("sample"))
        if progress is not None:
            progress(1)

    measured_runs = runs(k, step)
    measured = _measured(measured_runs)
    verdict = judge(measured, k)
    measured["failed_checks"] = [c.name for c in verdict.checks if not c.ok]
    measured["disturbed_by_other_sessions"] = [
        name for name, df in measured_runs.items() if _disturbed(name, df)]
    table = pd.DataFrame({
        name: {"jobs": int(df["jobs_done"].iloc[-1]),
               "first_ms": float(df["median_ms"].iloc[0]),
               "last_ms": float(df["median_ms"].iloc[-1]),
               "growth": _growth(df), "ms_per_10k": round(slope(df), 3),
               "buffers_at_end": int(df["buffers"].iloc[-1]),
               "foreign_blocks": int((df["foreign_holders"] > 0).sum())}
        for name, df in measured_runs.items()}).T
    return Result("horizon", k, measured, verdict, table=table,
                  data={"runs": measured_runs})


def _measured(r: dict[str, pd.DataFrame]) -> dict[str, Any]:
    held, free, rel = r["held"], r["free"], r["release"]
    n = int(free["jobs_done"].iloc[-1])
    lines = {key: df for key, df in r.items() if key != "release"}
    slopes = {key: round(slope(df), 4) for key, df in lines.items()}
    return plain({
        "block_median_ms": {"held": held["median_ms"].tolist(),
                            "free": free["median_ms"].tolist()},
        # Buffers one fetch reads at every block's end, per run: the mechanism, not a clock.
        "block_buffers": {key: df["buffers"].tolist() for key, df in lines.items()},
        "buffers_per_10k": {key: round(slope(df, "buffers"), 1) for key, df in lines.items()},
        "explain": {"held": _half(held, n), "free": _half(free, n)},
        "after_release_ms": float(rel["median_ms"].iloc[-1]),
        "after_release_buffers": int(rel["buffers"].iloc[-1]),
        "release_held_ms": rel["median_ms"].tolist(),
        "slope_ms_per_10k": slopes,
        "slope_ci_ms_per_10k": {key: slope_ci(df) for key, df in lines.items()},
        "slope_ratio": round(slopes["held"] / max(slopes["free"], FLAT), 1),
        "growth": {key: _growth(df) for key, df in r.items()},
        "done_status_ms": r["done_status"]["median_ms"].tolist(),
        "repeatable_read_ms": r["repeatable_read"]["median_ms"].tolist(),
        "jobs": n, "block": int(free["jobs_done"].iloc[0]),  # jobs done after the first block
        "foreign_blocks": {key: int((df["foreign_holders"] > 0).sum()) for key, df in r.items()},
        "tries": {key: df.attrs.get("tries", 1) for key, df in r.items()},
    })


#: Buffers are the mechanism and no clock moves them: a held fetch must read at least CLIMB times
#: the buffers of its first block by the last (measured: 3× over 4 blocks, 8× over 12), and its
#: buffers must grow FASTER times as fast per job as the free run's (measured: 7-8×).
CLIMB, FASTER = 2, 3


#: "Straight": the held line strays from its fitted line (as a share of its level) at most this
#: many times as far as the free line from its own (the run's noise), NOISE_FLOOR at least.
STRAIGHT = 3.0
NOISE_FLOOR = 0.02


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Judge the buffers (behaviour) and the line's shape (timing) against the article.

    The buffers one fetch reads come from EXPLAIN (ANALYZE, BUFFERS): a count of pages, not a
    clock, so a shared machine cannot move them. The checks on milliseconds are marked
    ``timing``; the one that compares the held slope with the free one takes the free line's
    noise into view (95 % bounds of both slopes), not a ratio whose denominator is noise.
    """
    k = knobs or Knobs()
    m = measured
    held, free = m["block_median_ms"]["held"], m["block_median_ms"]["free"]
    growth, slopes, ex = m["growth"], m["slope_ms_per_10k"], m["explain"]
    bufs, per10k = m["block_buffers"], m["buffers_per_10k"]
    r2 = _r_squared(held, m["block"])
    straight = _scatter(held, free)
    flat = _fitted_growth(free)
    r2_buf = _r_squared(bufs["held"], m["block"])
    release = m["release_held_ms"]
    art = ARTICLE
    ci = m["slope_ci_ms_per_10k"]
    faster = per10k["held"] / max(per10k["free"], 1.0)
    checks = [
        check("held: every fetch reads more",
              _climbs(bufs["held"]) and r2_buf is not None and r2_buf >= 0.95,
              f"buffers per fetch at least {CLIMB}× from first to last block, in a straight "
              "line (r² ≥ 0.95)",
              f"{bufs['held'][0]} → {bufs['held'][-1]} buffers"
              + ("" if r2_buf is None else f", r² {r2_buf:.3f}")),
        check("held reads more than free", faster >= FASTER,
              f"the buffers per fetch grow at least {FASTER}× as fast per job",
              f"{per10k['held']:,.0f} vs {per10k['free']:,.0f} more buffers per 10,000 jobs"),
        check("EXPLAIN reads more, held", ex["held"]["buffers"] >= 2 * ex["free"]["buffers"],
              f"held at least 2× the free run's buffers (article: "
              f"{art['explain']['held']['buffers']} vs {art['explain']['free']['buffers']})",
              f"{ex['held']['buffers']} vs {ex['free']['buffers']} buffers after "
              f"{ex['held']['at_jobs']:,} jobs"),
        check("status 'done' reads more too", _climbs(bufs["done_status"]),
              f"buffers at least {CLIMB}× from first to last block",
              f"{bufs['done_status'][0]} → {bufs['done_status'][-1]} buffers"),
        check("REPEATABLE READ reads more too", _climbs(bufs["repeatable_read"]),
              f"buffers at least {CLIMB}× from first to last block",
              f"{bufs['repeatable_read'][0]} → {bufs['repeatable_read'][-1]} buffers"),
        check("few buffers after release", m["after_release_buffers"] * 2 <= bufs["held"][-1],
              "at most half the last held block's", f"{m['after_release_buffers']} vs "
              f"{bufs['held'][-1]} buffers"),
        check("held line climbs", growth["held"] >= 2 and slopes["held"] > 0,
              f"at least 2× from first to last block (article: {art['held_first_ms']} → "
              f"{art['held_last_ms']} ms)",
              f"{held[0]:.2f} → {held[-1]:.2f} ms (×{growth['held']:.2f})", timing=True),
        check("held line is straight",
              straight is not None and straight[0] <= STRAIGHT * max(straight[1], NOISE_FLOOR),
              f"off its straight line by at most {STRAIGHT:g}× the free line's own scatter "
              "(what remains is noise, not a bend)",
              "too few blocks" if straight is None else
              f"{straight[0]:.1%} vs {straight[1]:.1%} of its level"
              + ("" if r2 is None else f" (r² {r2:.2f})"), timing=True),
        check("free line flat", flat is not None and flat < 1.5,
              "its fitted line less than 1.5× higher at the last block than at the first",
              f"{free[0]:.2f} → {free[-1]:.2f} ms" + ("" if flat is None else
                                                       f", fitted ×{flat:.2f}"), timing=True),
        check("held climbs beyond the free line's noise",
              None not in (ci["held"][0], ci["free"][1])
              and ci["held"][0] > max(ci["free"][1], 0.0),
              "the held slope's lower 95 % bound above the free slope's upper bound",
              f"held {slopes['held']:.3f} ({_bounds(ci['held'])}), free {slopes['free']:.3f} "
              f"({_bounds(ci['free'])}) ms per 10,000 jobs", timing=True),
        check("status 'done' climbs too", growth["done_status"] >= 1.5,
              "at least 1.5× from first to last block", f"×{growth['done_status']:.2f}",
              timing=True),
        check("REPEATABLE READ climbs too", growth["repeatable_read"] >= 1.5,
              "at least 1.5× from first to last block", f"×{growth['repeatable_read']:.2f}",
              timing=True),
        check("fast again after release", m["after_release_ms"] <= 1.5 * release[0],
              f"at most 1.5× the first block (article: {art['after_release_ms']} ms)",
              f"{m['after_release_ms']:.2f} ms after {release[-2]:.2f} held; first block "
              f"{release[0]:.2f}" if len(release) > 1 else f"{m['after_release_ms']:.2f} ms",
              timing=True),
    ]
    return Verdict.of(checks, article=k.is_article_setup())


def _bounds(ci: list[float | None]) -> str:
    return "too few blocks" if None in ci else f"{ci[0]:.3f} to {ci[1]:.3f}"


def _climbs(buffers: list[int]) -> bool:
    return len(buffers) >= 2 and buffers[-1] >= CLIMB * max(buffers[0], 1)


def _fit(medians: list[float]) -> tuple[np.ndarray, np.ndarray] | None:
    """Return the medians and their least-squares line, per block; None below 3 blocks."""
    if len(medians) < 3:
        return None
    y = np.asarray(medians, dtype=float)
    x = np.arange(len(y), dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    return y, slope * x + intercept


def _scatter_of(medians: list[float]) -> float | None:
    """Return how far the medians stray from their least-squares line, as a share of their mean
    (root-mean-square): noise on a slow fetch is larger in ms, not as a share."""
    if (fit := _fit(medians)) is None:
        return None
    y, line = fit
    return float(np.sqrt(np.mean((y - line) ** 2)) / max(y.mean(), 1e-9))


def _scatter(held: list[float], free: list[float]) -> tuple[float, float] | None:
    """Return (held, free) scatter around their straight lines; None below 3 blocks.

    The free line is the same fetch on the same machine with nothing held: its scatter is this
    run's noise. A held line that bends (a step, a plateau) strays further from its line.
    """
    h, f = _scatter_of(held), _scatter_of(free)
    return None if h is None or f is None else (h, f)


def _fitted_growth(medians: list[float]) -> float | None:
    """Return the fitted line's value at the last block over its value at the first."""
    if (fit := _fit(medians)) is None:
        return None
    first, last = fit[1][0], fit[1][-1]
    return float(last / first) if first > 0 else None


def _r_squared(medians: list[float], block: int) -> float | None:
    """Return r² of the medians against jobs fetched (a block's end), or None below 3 blocks."""
    if len(medians) < 3:
        return None
    r = np.corrcoef([block * (i + 1) for i in range(len(medians))], medians)[0, 1]
    return float(r * r)
