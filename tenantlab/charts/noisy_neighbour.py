"""Notebook 11's noisy-neighbour charts: each group's backlog and wait while workers drain."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..finding import Result
from . import common
from .palette import CORRECTED, NAIVE, NEUTRAL

POLICIES = ["fifo", "round-robin", "limit"]
GROUPS = ["tenant 1 (burst)", "small tenants (99)"]
METRICS = {"backlog": "jobs still queued", "oldest_wait_s": "oldest queued job has waited (s)"}
ARRIVALS = ["arriving during the drain", "all queued first"]
ARRIVAL_KEYS = {"during_drain": ARRIVALS[0], "queued_first": ARRIVALS[1]}


def chart(df: pd.DataFrame) -> alt.TopLevelMixin:
    """Return one panel per policy and metric: the burst's line and the small tenants', solid
    for the jobs arriving during the drain, dashed for everything queued first."""
    if df.empty:
        df = pd.DataFrame([{"policy": p, "arrival": ARRIVALS[0], "t": 0.0, "tenant": g,
                            "backlog": 0, "oldest_wait_s": 0.0}
                           for p in POLICIES[:1] for g in GROUPS])
    if "arrival" not in df:
        df = df.assign(arrival=ARRIVALS[0])
    long = df.melt(id_vars=["policy", "arrival", "t", "tenant"], value_vars=list(METRICS),
                   var_name="metric", value_name="value")
    long["metric"] = long["metric"].map(METRICS)
    return alt.Chart(long).mark_line(interpolate="step-after").encode(
        x=alt.X("t:Q", title="seconds since the burst"),
        y=alt.Y("value:Q", title=None),
        color=alt.Color("tenant:N", title=None,
                        scale=alt.Scale(domain=GROUPS, range=[NAIVE, CORRECTED])),
        strokeDash=alt.StrokeDash("arrival:N", title=None, sort=ARRIVALS),
        detail="arrival:N",
        tooltip=["policy", "arrival", "tenant", "t", "value"],
    ).properties(width=150, height=120).facet(
        row=alt.Row("metric:N", title=None, sort=list(METRICS.values())),
        column=alt.Column("policy:N", title=None, sort=POLICIES),
    ).resolve_scale(y="independent").properties(
        title="While the workers drain: the small tenants' wait climbs under FIFO, stays flat when fair")


def live() -> nb.LiveChart:
    """Return the chart that redraws while the workers drain the queue."""
    return nb.LiveChart(chart, pd.DataFrame())


def tenants(res: Result) -> alt.Chart:
    """Return each tenant's worst wait (enqueue to start), one line per policy and arrival."""
    waits = res.data["waits"]
    if "arrival" not in waits:
        waits = waits.assign(arrival=ARRIVALS[0])
    per = waits.groupby(["arrival", "policy", "tenant_id"], as_index=False)["wait_s"].max()
    return alt.Chart(per).mark_line(point=True).encode(
        x=alt.X("tenant_id:Q", title="tenant (1 = the burst)"),
        y=alt.Y("wait_s:Q", title="its longest wait, enqueue to start (s)"),
        color=alt.Color("policy:N", sort=POLICIES,
                        scale=alt.Scale(domain=POLICIES, range=[NAIVE, CORRECTED, NEUTRAL])),
        strokeDash=alt.StrokeDash("arrival:N", title=None, sort=ARRIVALS),
        tooltip=["arrival", "policy", "tenant_id", "wait_s"],
    ).properties(width=520, height=220, title="Every tenant's longest wait, per claim policy")


def summary(res: Result) -> Any:
    """Return the waits and jobs/s per arrival and policy, the columns a reader compares."""
    assert res.table is not None
    names = {"small_tenants_p95_lower": "small tenants' p95: x lower",
             "small_tenants_wait_median_s": "small tenants: median wait (s)",
             "small_tenants_wait_p95_s": "small tenants: p95 wait (s)",
             "small_tenants_wait_max_s": "small tenants: max wait (s)",
             "noisy_tenant_wait_median_s": "noisy tenant: median wait (s)",
             "noisy_tenant_wait_p95_s": "noisy tenant: p95 wait (s)",
             "jobs_per_s": "jobs/s", "duplicates": "run twice"}
    table = res.table.reset_index(drop="policy" in res.table.columns)
    if "index" in table:  # a table indexed by policy
        table = table.rename(columns={"index": "policy"})
    lower = res.measured.get("small_tenants_p95_lower", {})
    keys = {label: key for key, label in ARRIVAL_KEYS.items()}
    table["small_tenants_p95_lower"] = [
        lower.get(keys.get(r.get("arrival", ARRIVALS[0]), "during_drain"), {}).get(r["policy"])
        for r in table.to_dict("records")]
    shown = table[[c for c in ["arrival", "policy", *names] if c in table.columns]]
    return nb.table(shown.rename(columns=names))


def explorer() -> Any:
    """Return sliders for the burst, the workers, the limit, a policy choice and Run."""
    return nb.explorer("noisy-neighbour", summary, live=live)


def report_chart(m: dict[str, Any]) -> alt.Chart:
    """Return the report page's chart: the small tenants' p95 wait per policy."""
    rows = [{"policy": p, "what": "small tenants' p95 wait (s)",
             "n": m[p]["small_tenants_wait_p95_s"]} for p in POLICIES if p in m]
    rows += [{"policy": p, "what": "noisy tenant's p95 wait (s)",
              "n": m[p]["noisy_tenant_wait_p95_s"]} for p in POLICIES if p in m]
    return common.bars(rows, "policy", "what", "n")
