"""Charts and widgets of finding ``vacuum``: removed vs dead-but-not-removable, per long job."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import vacuum
from ..finding import Result

ORDER = [v.label for v in vacuum.VARIANTS]
DEAD, REMOVED = "dead, not yet removable", "removed (or pruned)"
COLORS = {DEAD: "#d62728", REMOVED: "#2ca02c"}
#: Headers wrap: a table must fit a 1280 px screen with the file browser open.
WRAP = [{"selector": "th", "props": "white-space: normal; max-width: 8em"}]


def chart(df: pd.DataFrame) -> alt.TopLevelMixin:
    """Return two panels per variant: dead row versions VACUUM could not remove, and removed.

    Each panel has its own scale: a handful removed would be invisible beside thousands held.
    """
    if df.empty:
        df = pd.DataFrame({"label": [], "removable": [], "dead_not_removable": [],
                           "long_job_holds": [], "seconds": []})
    return alt.hconcat(_panel(df, "dead_not_removable", DEAD, axis=True),
                       _panel(df, "removable", REMOVED, axis=False),
                       title=alt.TitleParams("What VACUUM (VERBOSE) did while the long job "
                                             "ran", anchor="start", offset=14))


def _panel(df: pd.DataFrame, column: str, what: str, axis: bool) -> Any:
    d = df.assign(n=df[column].astype(int))
    top = max(1, int(d["n"].max()) if len(d) else 1) * 1.25  # room for the count
    y = alt.Y("label:N", title=None, sort=ORDER, scale=alt.Scale(domain=ORDER),
              axis=alt.Axis(labelLimit=300) if axis else None)
    base = alt.Chart(d).encode(
        y=y, x=alt.X("n:Q", title="row versions", scale=alt.Scale(domain=[0, top])),
        tooltip=[alt.Tooltip("label:N", title="long job"), alt.Tooltip("n:Q", title=what),
                 alt.Tooltip("long_job_holds:N", title="long job holds"),
                 alt.Tooltip("seconds:Q", title="short jobs (s)")])
    bars = base.mark_bar(color=COLORS[what])
    # The count beside each bar: a 0 or a 2 is the point of some rows.
    text = base.mark_text(align="left", dx=3).encode(text=alt.Text("n:Q", format=","))
    return alt.layer(bars, text).properties(width=190, height=150, title=what)


def report_chart(m: dict[str, Any]) -> alt.TopLevelMixin:
    """Return the report page's chart of what `reproduce` measured: the notebook's chart."""
    # The exported worker's jobs ran beside no short jobs: no seconds of theirs.
    rows = [{"label": v.label, "removable": m[v.name]["removable"],
             "dead_not_removable": m[v.name]["dead_not_removable"],
             "long_job_holds": m[v.name]["long_job_holds"],
             "seconds": m[v.name].get("seconds")}
            for v in vacuum.VARIANTS if v.name in m]
    return chart(pd.DataFrame(rows))


def plan() -> Any:
    """Return the long jobs: what each keeps open, and what the article expects of it."""
    keeps = {
        "single_for_update": "claim FOR UPDATE, long work and finish in one transaction",
        "leased_outside": "claim committed; the long work runs with no transaction open",
        "leased_wrote": "claim committed; the work writes a row first, then works for long",
        "read_committed_idle": "a select, idle in the transaction, another select",
        "repeatable_read": "the same in REPEATABLE READ: the first select fixes a snapshot",
        "jobqueue_reads": "python -m jobqueue worker; its handler counts the "
                          "tenant's invoices, then sleeps",
        "jobqueue_writes": "the same worker; its handler inserts one row, then sleeps",
    }
    return pd.DataFrame([
        {"long job": v.label, "keeps open": keeps[v.name],
         "the article": "holds VACUUM back" if v.holds_back else "holds nothing"}
        for v in vacuum.VARIANTS]).style.hide(axis="index")


def live() -> nb.LiveChart:
    """Return a chart, shown now, that fills in as each variant ends."""
    chart_ = nb.LiveChart(chart)
    nb.show(chart_)
    return chart_


def run_live(full: bool = False) -> Result:
    """Run every variant with a progress bar and a live chart; return the result."""
    knobs = vacuum.Knobs.full() if full else vacuum.Knobs()
    chart_ = live()
    with nb.progress(len(knobs.variants), "variants") as bar:
        return vacuum.run(knobs, live=chart_, progress=bar)


def table(res: Result) -> Any:
    """Return the measurement: per variant what it held, VACUUM's counts, short jobs' seconds."""
    assert res.table is not None
    df = res.table
    return pd.DataFrame({
        "long job": df["label"], "long job holds": df["long_job_holds"],
        "dead, not removable": df["dead_not_removable"].astype(int),
        "removed": df["removable"].astype(int),
        "the article": df["expected_holds_back"].map({True: "holds back", False: "holds nothing"}),
        "here": df["holds_back"].map({True: "holds back", False: "holds nothing"}),
        "short jobs (s)": df["seconds"],
    }).style.hide(axis="index").set_table_styles(WRAP).format(
        {"short jobs (s)": "{:.2f}", "dead, not removable": "{:,}", "removed": "{:,}"},
        na_rep="")


def exported(res: Result) -> Any:
    """Return the exported worker's jobs: dead rows held while each ran, and after its finish."""
    assert res.table is not None
    df = res.table[res.table["variant"].map(lambda n: vacuum.BY_NAME[n].kind is not None)]
    return pd.DataFrame({
        "handler": df["variant"].map(lambda n: vacuum.BY_NAME[n].kind),
        "its session holds": df["long_job_holds"],
        "dead rows made": df["dead_rows"].astype(int),
        "not removable while it ran": df["dead_not_removable"].astype(int),
        "not removable after its finish": df["held_after_finish"].astype(int),
        "job": df["job"],
    }).style.hide(axis="index").set_table_styles(WRAP).format(thousands=",")


def explorer() -> Any:
    """Return sliders for the long job's seconds and the short jobs, a long job form, and Run."""
    import ipywidgets as w
    from IPython.display import display

    knobs = vacuum.Knobs.full() if nb.full() else vacuum.Knobs()
    controls = nb.controls(knobs)
    which = w.Dropdown(options=[(v.label, v.name) for v in vacuum.VARIANTS],
                       value="leased_wrote", description="long job",
                       style={"description_width": "initial"}, layout=w.Layout(width="360px"))

    def run() -> None:
        chosen = vacuum.Knobs.of(nb.full(), variants=(which.value,),
                                 **{k: c.value for k, c in controls.items()})
        res = vacuum.run(chosen, live=live())
        display(res.verdict)
        display(table(res))

    return nb.run_panel([list(controls.values()), [which]], run)
