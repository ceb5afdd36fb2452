"""Charts and widgets of finding ``vacuum``: removed vs dead-but-not-removable, per long job."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from .. import nb
from ..experiments import vacuum

ORDER = [v.label for v in vacuum.VARIANTS]
COLORS = {"removed (or pruned)": "#2ca02c", "dead, not yet removable": "#d62728"}


def chart(df: pd.DataFrame) -> alt.TopLevelMixin:
    """Return bars per variant: dead row versions VACUUM removed vs could not remove yet."""
    if df.empty:
        return alt.Chart(pd.DataFrame({"x": []})).mark_bar()
    long = df.melt(id_vars=["label", "seconds", "long_job_holds"],
                   value_vars=["removable", "dead_not_removable"], var_name="what",
                   value_name="tuples")
    long["what"] = long["what"].map({"removable": "removed (or pruned)",
                                     "dead_not_removable": "dead, not yet removable"})
    return alt.Chart(long).mark_bar().encode(
        y=alt.Y("label:N", title=None, sort=ORDER),
        x=alt.X("tuples:Q", title="row versions, VACUUM (VERBOSE) jobs"),
        color=alt.Color("what:N", title=None, legend=alt.Legend(orient="bottom"),
                        scale=alt.Scale(domain=list(COLORS), range=list(COLORS.values()))),
        tooltip=["label", "what", "tuples", "long_job_holds", "seconds"],
    ).properties(width=360, height=180,
                 title="What VACUUM could remove while the long job ran")


def run_with_progress(full: bool = False, **params: Any) -> tuple[pd.DataFrame, dict, Any]:
    """Run the variants with a progress bar; the chart fills in as each variant ends."""
    live = nb.LiveChart(chart)
    nb.show(live)
    rows: list[dict[str, Any]] = []
    names = params.get("variants") or tuple(vacuum.BY_NAME)
    with nb.progress(len(names), "variants") as bar:
        def step(event: dict[str, Any]) -> None:
            if event["phase"] == "done":
                rows.append(event)
                live.update(pd.DataFrame(rows))
                bar()
        df, summary = vacuum.run(full=full, progress=step, **params)
    return df, summary, live


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Return the measurement: per variant what it held, VACUUM's counts, short jobs' seconds."""
    return df.set_index("label")[["long_job_holds", "removable", "dead_not_removable",
                                  "expected_holds_back", "holds_back", "seconds"]].rename(
        columns={"long_job_holds": "long job holds", "expected_holds_back": "article: holds back",
                 "holds_back": "holds back here", "seconds": "short jobs (s)"})


def verdict(df: pd.DataFrame) -> str:
    """Return the verdict: exactly the article's holders left dead tuples unremovable."""
    ok = bool((df["holds_back"] == df["expected_holds_back"]).all())
    expected = "held back by: " + ", ".join(df[df["expected_holds_back"]]["variant"])
    measured = "held back by: " + ", ".join(df[df["holds_back"]]["variant"])
    return nb.verdict(ok, expected, measured)


def explorer() -> Any:
    """Return sliders for the long job's seconds and the short jobs, a variant, and Run."""
    import ipywidgets as w
    from IPython.display import display

    seconds = w.FloatSlider(value=2.0, min=0.5, max=20, step=0.5, description="long job s")
    short = w.IntSlider(value=1000, min=100, max=5000, step=100, description="short jobs")
    which = w.Dropdown(options=[(v.label, v.name) for v in vacuum.VARIANTS],
                       value="leased_wrote", description="long job")
    def run() -> None:
        df, _ = vacuum.run(long_seconds=seconds.value, short=short.value,
                           variants=(which.value,))
        display(table(df))

    return nb.run_panel([[seconds, short], [which]], run)
