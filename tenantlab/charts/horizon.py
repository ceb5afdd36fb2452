"""Charts and widgets of finding ``horizon``: the fetch-time line, block by block, and the monitor.

The line and the monitor's table sit side by side and update after every block; the same
functions work outside a notebook (nothing is displayed, the data is returned).
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import horizon

COLORS = {"free": "#2ca02c", "held": "#d62728", "done_status": "#ff7f0e",
          "repeatable_read": "#9467bd", "release": "#1f77b4", "timeout": "#8c564b",
          "rc": "#17becf"}
LABELS = {"free": "nobody holds the horizon", "held": "a transaction with an id held open",
          "done_status": "status = 'done' + partial index, held",
          "repeatable_read": "read-only REPEATABLE READ held open",
          "release": "held, then released", "timeout": "held until the idle timeout",
          "rc": "read-only READ COMMITTED, idle"}
VARIANT_OF_HOLDER = {None: "free", "xid": "held", "rr": "repeatable_read", "rc": "rc"}


def chart(df: pd.DataFrame) -> alt.TopLevelMixin:
    """Return two panels: median fetch ms per block, and the buffers one fetch reads."""
    if df.empty:
        df = pd.DataFrame({"block": [], "jobs_done": [], "median_ms": [], "buffers": [],
                           "variant": [], "held": []})
    d = df.assign(label=df["variant"].map(lambda v: LABELS.get(v, v)),
                  holder=df["held"].map({True: "held", False: "free"}))
    color = alt.Color("label:N", title=None, legend=alt.Legend(orient="bottom", columns=2),
                      scale=alt.Scale(domain=[LABELS[k] for k in COLORS],
                                      range=list(COLORS.values())))
    base = alt.Chart(d).encode(
        x=alt.X("jobs_done:Q", title="jobs fetched so far"), color=color,
        tooltip=["label:N", "block:Q", "jobs_done:Q", "median_ms:Q", "buffers:Q", "holder:N"])
    ms = base.mark_line(point=True).encode(
        y=alt.Y("median_ms:Q", title="median fetch time per block (ms)"),
        shape=alt.Shape("holder:N", title="at the block's end"),
    ).properties(width=330, height=170, title="Fetch time per block")
    buf = base.mark_line(point=True, strokeDash=[4, 2]).encode(
        y=alt.Y("buffers:Q", title="buffers one fetch reads (EXPLAIN)"),
    ).properties(width=330, height=120, title="Buffers per fetch")
    return alt.vconcat(ms, buf)


class Live:
    """A chart and the monitor's table side by side, redrawn after every block."""

    def __init__(self) -> None:
        self.chart = nb.LiveChart(chart)
        self.rows: list[dict[str, Any]] = []
        self.monitor = None
        if nb.in_notebook():
            import ipywidgets as w

            self.monitor = w.HTML("<i>the monitor's table appears after the first block</i>")
            children = [self.chart.widget, self.monitor]
            self.box = w.HBox(children)
            nb.show(self.box)

    def __call__(self, row: dict[str, Any], variant: str = "held") -> None:
        sample = row.pop("sample")
        row.pop("pids", None)
        self.rows.append(dict(row, variant=row.get("variant", variant)))
        self.chart.update(pd.DataFrame(self.rows))
        if self.monitor is not None:
            self.monitor.value = monitor_html(sample, row)

    def data(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def monitor_html(sample: Any, row: dict[str, Any]) -> str:
    """Return the monitor's view: who holds the horizon, dead tuples, the latest fetch time."""
    t = sample.table().head(5).to_html(index=False, na_rep="", border=0)
    dead = sample.tuples.get("n_dead_tup")
    return (f"<b>Who holds the horizon</b> (pg_stat_activity, oldest first; after block "
            f"{row['block']}, {row.get('variant', '')})<br>{t}"
            f"<br>jobs: <b>{dead}</b> dead row versions (pg_stat_user_tables) · latest block "
            f"median fetch <b>{row['median_ms']:.3f} ms</b>, {row['buffers']} buffers")


def run_variants(full: bool = False) -> tuple[dict[str, pd.DataFrame], Live]:
    """Run the article's five variants with a progress bar; one live chart for all of them."""
    size = horizon.FULL if full else horizon.WORKSHOP
    n, block = size["jobs"], size["block"]
    short = int(n * 0.6) // block * block
    live = Live()
    with nb.progress(2 * n // block + 3 * short // block, "blocks") as bar:
        def step(row: dict[str, Any]) -> None:
            live(row)
            bar()
        runs = horizon.variants(full=full, progress=step)
    return runs, live


def run_one(variant: str = "held", progress: nb.Progress | None = None, live: Live | None = None,
            **params: Any) -> tuple[pd.DataFrame, dict[str, Any], Live]:
    """Run ``horizon.run(**params)`` live (a new chart unless one is given)."""
    live = live or Live()

    def step(row: dict[str, Any]) -> None:
        live(dict(row, variant=variant))
        if progress is not None:
            progress()
    df, summary = horizon.run(progress=step, **params)
    return df, summary, live


def timeout_demo(timeout: float = 3.0, jobs: int = 12_000, block: int = 1_000
                 ) -> tuple[pd.DataFrame, dict[str, Any], Live]:
    """Hold the horizon with an idle session whose idle_in_transaction_session_timeout ends it."""
    with nb.progress(jobs // block, "blocks") as bar:
        return run_one("timeout", bar, jobs=jobs, block=block, holder="xid",
                       idle_timeout=timeout)


def explain_table(measured: dict[str, Any]) -> pd.DataFrame:
    """Return the half-way EXPLAIN, here and in the article, held vs free."""
    ex: dict[str, Any] = measured["explain"]
    art: dict[str, Any] = horizon.ARTICLE["explain"]
    return pd.DataFrame({
        "buffers here": {k: ex[k]["buffers"] for k in ("held", "free")},
        "ms here": {k: ex[k]["ms"] for k in ("held", "free")},
        "buffers (article)": {k: art[k]["buffers"] for k in ("held", "free")},
        "ms (article)": {k: art[k]["ms"] for k in ("held", "free")},
    }).rename_axis(f"EXPLAIN after {ex['held']['at_jobs']:,} jobs")


def verdict(result: dict[str, Any]) -> str:
    """Return the verdict line: shape and ratios, not absolute milliseconds."""
    m = result["measured"]
    held, free = m["block_median_ms"]["held"], m["block_median_ms"]["free"]
    measured = (f"held {held[0]:.2f} -> {held[-1]:.2f} ms (x{m['growth']['held']}), free "
                f"{free[0]:.2f} -> {free[-1]:.2f} ms; held grows {m['slope_ratio']}x faster; "
                f"after release {m['after_release_ms']:.2f} ms")
    if m["failed_checks"]:
        measured += f" — failed: {', '.join(m['failed_checks'])}"
    return nb.verdict(result["reproduced"],
                      "a straight climbing line while held (0.7 -> 8.3 ms), flat when free, "
                      "fast again right after release", measured)


def explorer() -> Any:
    """Return sliders for queue size, block size, holder kind and design, with a Run button."""
    import ipywidgets as w

    jobs = w.IntSlider(value=10_000, min=2_000, max=60_000, step=2_000, description="jobs")
    block = w.IntSlider(value=1_000, min=500, max=10_000, step=500, description="block")
    holder = w.Dropdown(options=[("nobody", None), ("transaction with an id", "xid"),
                                 ("REPEATABLE READ reader", "rr"),
                                 ("READ COMMITTED reader", "rc")],
                        value="xid", description="holder")
    design = w.Dropdown(options=list(horizon.DESIGNS), value="delete", description="fetch")
    def run() -> None:
        size = max(block.value, jobs.value // block.value * block.value)
        with nb.progress(size // block.value, "blocks") as bar:
            run_one(VARIANT_OF_HOLDER[holder.value], bar, jobs=size, block=block.value,
                    holder=holder.value, design=design.value)

    return nb.run_panel([[jobs, block], [holder, design]], run)


def table(runs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Return one row per variant: first and last block median, growth, slope, buffers."""
    return pd.DataFrame({
        LABELS[k]: {
            "jobs": int(df["jobs_done"].iloc[-1]),
            "first block ms": float(df["median_ms"].iloc[0]),
            "last block ms": float(df["median_ms"].iloc[-1]),
            "growth": round(float(df["median_ms"].iloc[-1] / df["median_ms"].iloc[0]), 2),
            "ms per 10,000 jobs": round(horizon.slope(df[df["held"] == df["held"].iloc[0]]), 3),
            "buffers at the end": int(df["buffers"].iloc[-1]),
            "blocks with a foreign holder": int((df["foreign_holders"] > 0).sum()),
        } for k, df in runs.items()
    }).T
