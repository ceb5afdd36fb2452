"""Charts and widgets of finding ``horizon``: the fetch-time line, block by block, and the monitor.

The line and, below it, the monitor's table update after every block; the same functions work
outside a notebook (nothing is displayed, the data is returned).
"""

from __future__ import annotations

import html
import time
from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import horizon
from ..finding import Result

# Held (the trap) red, free green, as in every notebook; the other held runs in warm tones.
COLORS = {"free": "#2ca02c", "held": "#d62728", "xid": "#d62728", "done_status": "#ff7f0e",
          "repeatable_read": "#9467bd", "timeout": "#8c564b", "rc": "#17becf"}
LABELS = {"free": "nobody holds the horizon",
          "held": "a transaction with an id, released for the last block",
          "xid": "a transaction with an id, held",
          "done_status": "status = 'done' + partial index, held",
          "repeatable_read": "read-only REPEATABLE READ, held",
          "timeout": "held until the idle timeout",
          "rc": "read-only READ COMMITTED, idle"}
VARIANT_OF_HOLDER = {None: "free", "xid": "xid", "rr": "repeatable_read", "rc": "rc"}


def chart(df: pd.DataFrame) -> alt.TopLevelMixin:
    """Return two panels: median fetch ms per block, and the buffers one fetch reads."""
    if df.empty:
        df = pd.DataFrame({"block": [], "jobs_done": [], "median_ms": [], "buffers": [],
                           "variant": [], "held": []})
    base = _base(df)
    buf = base.mark_line(point=True, strokeDash=[4, 2]).encode(
        y=alt.Y("buffers:Q", title="buffers per fetch"),
    ).properties(width=420, height=110, title="Buffers one fetch reads (EXPLAIN)")
    return alt.vconcat(_fetch_ms(base), buf)


def _base(df: pd.DataFrame) -> alt.Chart:
    d = df.assign(label=df["variant"].map(lambda v: LABELS.get(v, v)),
                  holder=df["held"].map({True: "held", False: "not held"}))
    shown = [k for k in COLORS if k in set(df["variant"])] or list(COLORS)
    color = alt.Color("label:N", title=None, legend=alt.Legend(orient="bottom", columns=2,
                                                               labelLimit=320),
                      scale=alt.Scale(domain=[LABELS[k] for k in shown],
                                      range=[COLORS[k] for k in shown]))
    return alt.Chart(d).encode(
        x=alt.X("jobs_done:Q", title="jobs fetched so far"), color=color,
        tooltip=["label:N", "block:Q", "jobs_done:Q", "median_ms:Q", "buffers:Q", "holder:N"])


def _fetch_ms(base: alt.Chart) -> Any:
    # A filled point while held, an open one after: the release shows where the line drops.
    y = alt.Y("median_ms:Q", title="median fetch (ms)")
    return alt.layer(
        base.mark_line().encode(y=y),
        base.transform_filter(alt.datum.holder == "held").mark_point(filled=True, size=40)
        .encode(y=y),
        base.transform_filter(alt.datum.holder != "held").mark_point(filled=False, size=40)
        .encode(y=y),
    ).properties(width=420, height=170, title="Fetch time per block")


def report_chart(m: dict[str, Any]) -> alt.TopLevelMixin:
    """Return the report page's chart of what `reproduce` measured: the fetch-time lines."""
    series = {"free": m["block_median_ms"]["free"], "held": m["release_held_ms"],
              "done_status": m["done_status_ms"], "repeatable_read": m["repeatable_read_ms"]}
    held_blocks = len(m["block_median_ms"]["held"])
    rows = [{"variant": k, "block": i + 1, "jobs_done": (i + 1) * m["block"], "median_ms": ms,
             "buffers": None, "held": k != "free" and (k != "held" or i < held_blocks)}
            for k, values in series.items() for i, ms in enumerate(values)]
    return _fetch_ms(_base(pd.DataFrame(rows)))


class Live:
    """A chart and, below it, the monitor's table, redrawn after every block.

    The chart is redrawn at most every ``every`` seconds (and by ``finish()``): one redraw
    costs a quarter of a second, a block sometimes less.
    """

    def __init__(self, every: float = 2.0) -> None:
        self.chart = nb.LiveChart(chart)
        self.rows: list[dict[str, Any]] = []
        self.every, self.drawn = every, 0.0
        self.monitor = None
        if nb.in_notebook():
            import ipywidgets as w

            self.monitor = w.HTML("<i>Who holds the horizon: the monitor's table appears "
                                  "after the first block.</i>")
            # One above the other: side by side they overflow a 1280 px screen.
            nb.show(w.VBox([self.chart.widget, self.monitor]))

    def __call__(self, row: dict[str, Any], variant: str = "held") -> None:
        sample = row.pop("sample")
        row.pop("pids", None)
        self.rows.append(dict(row, variant=row.get("variant", variant)))
        if time.monotonic() - self.drawn >= self.every:
            self.finish()
        if self.monitor is not None:
            self.monitor.value = monitor_html(sample, row)

    def update(self, frame: pd.DataFrame, sample: Any = None) -> None:
        """The finding's live protocol: every block so far, and the latest block's sample."""
        self.rows = frame.to_dict("records")
        if time.monotonic() - self.drawn >= self.every:
            self.finish()
        if self.monitor is not None and sample is not None and self.rows:
            self.monitor.value = monitor_html(sample, self.rows[-1])

    def finish(self) -> None:
        """Redraw the chart with every block so far."""
        self.chart.update(pd.DataFrame(self.rows))
        self.drawn = time.monotonic()

    def data(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def monitor_html(sample: Any, row: dict[str, Any]) -> str:
    """Return the monitor's view: who holds the horizon, dead tuples, the latest fetch time."""
    run = LABELS.get(row.get("variant", ""), row.get("variant", ""))
    head = (f"<b>Who holds the horizon</b> after block {row['block']} of “{html.escape(run)}” "
            "(pg_stat_activity, oldest first)")
    holders = sample.table().head(5)
    if holders.empty:
        body = "<p>nobody: no session holds a transaction id or a snapshot</p>"
    else:
        body = holders.to_html(index=False, na_rep="", border=0)
    dead = sample.tuples.get("n_dead_tup")
    return (f"<div style='max-width:100%;overflow-wrap:anywhere;font-size:90%'>{head}{body}"
            f"jobs: <b>{dead}</b> dead row versions (pg_stat_user_tables) · latest block: "
            f"median fetch <b>{row['median_ms']:.3f} ms</b>, {row['buffers']} buffers</div>")


def run_live(full: bool = False) -> Result:
    """Run the article's runs with a progress bar, one live chart and the monitor."""
    knobs = horizon.Knobs.full() if full else horizon.Knobs()
    live = Live()
    try:
        with nb.progress(horizon.blocks(knobs), "blocks") as bar:
            return horizon.run(knobs, live=live, progress=bar)
    finally:
        live.finish()


def drain_live(variant: str = "held", progress: nb.Progress | None = None,
               live: Live | None = None, **params: Any) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Run ``horizon.drain(**params)`` live (a new chart unless one is given)."""
    live = live or Live()

    def watch(row: dict[str, Any]) -> None:
        live(dict(row, variant=variant))
        if progress is not None:
            progress()
    try:
        return horizon.drain(watch=watch, **params)
    finally:
        live.finish()


def timeout_demo(timeout: float = 1.0, jobs: int = 4_000, block: int = 400) -> Any:
    """Hold the horizon with an idle session whose idle timeout ends it; return its blocks."""
    with nb.progress(jobs // block, "blocks") as bar:
        df, summary = drain_live("timeout", bar, jobs=jobs, block=block, holder="xid",
                                 idle_timeout=timeout)
    ended = "yes" if summary["ended_by_timeout"] else "no"
    return (df[["block", "jobs_done", "held", "median_ms", "buffers"]]
            .assign(held=df["held"].map({True: "held", False: "gone"}))
            .rename(columns={"jobs_done": "jobs fetched", "held": "holder",
                             "median_ms": "median fetch (ms)"})
            .style.hide(axis="index").format({"median fetch (ms)": "{:.3f}"})
            .set_caption(f"idle_in_transaction_session_timeout = {timeout:g} s ended the "
                         f"holder: {ended}"))


def explain_table(res: Result) -> Any:
    """Return the half-way EXPLAIN, here and in the article, held vs free."""
    ex: dict[str, Any] = res.measured["explain"]
    art: dict[str, Any] = horizon.ARTICLE["explain"]
    return pd.DataFrame([
        {"run": k, "buffers here": ex[k]["buffers"], "ms here": ex[k]["ms"],
         "buffers (article)": art[k]["buffers"], "ms (article)": art[k]["ms"]}
        for k in ("held", "free")
    ]).style.hide(axis="index").format({"ms here": "{:.3f}", "ms (article)": "{:g}"}).set_caption(
        f"EXPLAIN (ANALYZE, BUFFERS) of one fetch after {ex['held']['at_jobs']:,} jobs here, "
        f"{horizon.ARTICLE['explain_at']:,} in the article")


#: The runs as the measurement table names them (short: the table must fit the screen).
RUNS = {"free": "nobody holding", "held": "held (its held blocks)",
        "done_status": "status 'done', held", "repeatable_read": "REPEATABLE READ, held",
        "release": "held, then released"}
WRAP = [{"selector": "th", "props": "white-space: normal; max-width: 8em"}]


def table(res: Result) -> Any:
    """Return one row per run: first and last block median, growth, slope, buffers."""
    assert res.table is not None
    t = res.table
    return pd.DataFrame({
        "run": [RUNS[k] for k in t.index], "jobs": t["jobs"].astype(int),
        "first block (ms)": t["first_ms"], "last block (ms)": t["last_ms"],
        "growth": t["growth"], "ms per 10,000 jobs": t["ms_per_10k"],
        "buffers at the end": t["buffers_at_end"].astype(int),
        "blocks with a foreign holder": t["foreign_blocks"].astype(int),
    }).style.hide(axis="index").set_table_styles(WRAP).format({
        "first block (ms)": "{:.3f}", "last block (ms)": "{:.3f}", "growth": "×{:.2f}",
        "ms per 10,000 jobs": "{:.3f}", "jobs": "{:,}"})


def explorer() -> Any:
    """Return controls for queue size, block size, holder and fetch design, with a Run button."""
    controls = nb.controls(horizon.Drain())

    def run() -> None:
        k = horizon.Drain.of(**{name: c.value for name, c in controls.items()})
        size = max(k.block, k.jobs // k.block * k.block)
        with nb.progress(size // k.block, "blocks") as bar:
            drain_live(VARIANT_OF_HOLDER[k.holder], bar, jobs=size, block=k.block,
                       holder=k.holder, design=k.design)

    items = list(controls.values())
    return nb.run_panel([items[:2], items[2:]], run)
