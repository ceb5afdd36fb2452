"""Notebook 11's workers charts: jobs/s and where the workers' sessions spend their time."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..finding import Result
from . import common
from .palette import CORRECTED, NAIVE

CLAIMS = {"skip": "FOR UPDATE SKIP LOCKED", "plain": "plain FOR UPDATE"}
#: What a sampled session was doing, in the order the bars stack.
DOING = {"share_cpu": "on the CPU", "share_io": "IO (WAL flush)", "share_lwlock": "LWLock",
         "share_rowlock": "waiting on a row lock", "share_lock": "other lock",
         "share_client": "waiting for its worker process"}


def chart(df: pd.DataFrame) -> alt.TopLevelMixin:
    """Return jobs/s per worker count (one line per claim) beside the sessions' time shares."""
    if df.empty:
        df = pd.DataFrame([{"claim": "skip", "workers": 1, "jobs_per_s": 0.0,
                            "claim_ms_p95": 0.0, **dict.fromkeys(DOING, 0.0)}])
    df = df.assign(claim=df["claim"].map(CLAIMS))
    colour = alt.Color("claim:N", title=None, scale=alt.Scale(
        domain=list(CLAIMS.values()), range=[CORRECTED, NAIVE]))
    rate = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("workers:O", title="worker processes"),
        y=alt.Y("jobs_per_s:Q", title="jobs/s"), color=colour,
        tooltip=["claim", "workers", "jobs_per_s", "claim_ms_p95"],
    ).properties(width=220, height=200, title="Throughput")
    latency = rate.encode(y=alt.Y("claim_ms_p95:Q", title="claim latency p95 (ms)")).properties(
        title="Claim latency")
    shares = df.melt(id_vars=["claim", "workers"], value_vars=[c for c in DOING if c in df],
                     var_name="doing", value_name="share")
    shares["doing"] = shares["doing"].map(DOING)
    time_spent = alt.Chart(shares).mark_bar().encode(
        x=alt.X("workers:O", title="worker processes"),
        y=alt.Y("share:Q", title="share of the sessions' time", axis=alt.Axis(format="%")),
        color=alt.Color("doing:N", title="the workers' sessions", sort=list(DOING.values())),
        column=alt.Column("claim:N", title=None),
        tooltip=["claim", "workers", "doing", alt.Tooltip("share:Q", format=".1%")],
    ).properties(width=140, height=200)
    return alt.vconcat(alt.hconcat(rate, latency), time_spent)


def live() -> nb.LiveChart:
    """Return the chart that grows a point per round while the workers run."""
    return nb.LiveChart(chart, pd.DataFrame())


def table(res: Result) -> Any:
    """Return one row per round: claim, workers, jobs/s, claim latency, lock waits, CPU."""
    assert res.table is not None
    names = {"claim": "claim", "workers": "workers", "jobs_per_s": "jobs/s",
             "claim_ms_p50": "claim p50 (ms)", "claim_ms_p95": "claim p95 (ms)",
             "share_rowlock": "time on row locks",
             "share_finish_on_claim": "a finish on a claim",
             "share_claim_on_claim": "a claim on a claim", "lock_wait_s": "lock wait (s)",
             "machine_cpu_busy": "CPU busy", "duplicates": "run twice"}
    # Short headers with spaces: they wrap, and the table fits a laptop's output area.
    shown = res.table.reset_index(drop=True)[[c for c in names if c in res.table.columns]]
    return nb.table(shown.rename(columns=names))


def explorer() -> Any:
    """Return the jobs slider, the contrast switch and Run."""
    return nb.explorer("workers", table, live=live)


def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart: jobs/s per worker count."""
    rows = [{"claim": "SKIP LOCKED", "what": f"{w} workers", "n": r}
            for w, r in m["jobs_per_s"].items()]
    rows += [{"claim": "plain FOR UPDATE", "what": f"{w} workers", "n": r}
             for w, r in m.get("plain_for_update", {}).get("jobs_per_s", {}).items()]
    return common.bars(rows, "claim", "what", "n")


def recheck(res: Result) -> Any:
    """Return the re-check lock's two runs: what B's claim took, whether A's finish waited on it."""
    r = res.measured.get("recheck_lock", {})
    words = {"recheck": "B's snapshot before A's claim (paused)",
             "control": "B's claim after A's commit"}
    rows = [{"B's claim": words[case], "A claimed job": f["a_claimed"],
             "B claimed job": ", ".join(map(str, f["b_claimed"])) or "none",
             "A's finish of its job": (f"waited on B ({f['wait_event']})" if f["blocked_by_b"]
                                       else "waited" if f["finish_waited"] else "no wait"),
             "then": f["finish"]} for case, f in r.items()]
    return nb.table(pd.DataFrame(rows))
