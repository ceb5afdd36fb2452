"""What every notebook shares: the setup cell, live charts, progress bars, verdicts.

Notebooks call these; they hold no logic of their own. Everything here also works outside a
notebook (tests call the same functions, the widgets simply are not displayed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import altair as alt
import pandas as pd

from . import db
from . import settings as _settings
from .finding import Knobs, Result
from .server import ServerNotRunning

#: "workshop" (default) or "full": the article's sizes. CI and the browser test use "workshop".
SIZE = _settings.size()


def full() -> bool:
    """Return True when notebooks should run at the article's sizes (TENANTLAB_SIZE=full)."""
    return _settings.size() == "full"


@dataclass
class Lab:
    dsn: str
    version: str

    def __repr__(self) -> str:
        return f"PostgreSQL {self.version} is ready ({'full' if full() else 'workshop'} size)"


class SetupFailed(Exception):
    """The notebook's first cell could not reach the server: one line, no traceback.

    IPython shows what ``_render_traceback_`` returns instead of a traceback.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31m{self}\x1b[0m"]


def setup() -> Lab:
    """Check the server, build the template if needed, and make charts work offline."""
    try:
        dsn = db.admin_dsn()
        version = db.server_version(dsn)
        db.ensure_template(dsn)
    except ServerNotRunning:
        raise SetupFailed(
            "PostgreSQL is not running: in a terminal in the repository run `make lab` (or "
            "`tenantlab up`), or set TENANTLAB_DATABASE_URL to a PostgreSQL 15+ server; then "
            "run this cell again") from None
    except Exception as e:  # a refused login, a server that went away, a setting: the CLI's words
        from .cli import explain

        if (message := explain(e)) is None:
            raise
        raise SetupFailed(" ".join(message.splitlines()) + "; then run this cell again") from None
    _offline_charts()
    _tables()
    return Lab(dsn=dsn, version=version)


def _tables() -> None:
    # Evidence is never cut with "…": a long text wraps inside its column instead.
    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.max_rows", 200)
    if in_notebook():
        from IPython.display import HTML, display

        display(HTML("<style>.jp-RenderedHTMLCommon td, .jp-RenderedHTMLCommon th "
                     "{white-space: normal; max-width: 28em; text-align: left;}</style>"))


def table(df: pd.DataFrame) -> Any:
    """Return df for display without its index column and with missing values as blanks."""
    return df.style.hide(axis="index").format(_number, na_rep="")


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return f"{value:,.0f}"
    if isinstance(value, float):
        return f"{value:.3g}"
    return _cell(value)


def _offline_charts() -> None:
    # JupyterChart loads its JavaScript from vl-convert instead of a CDN: works without network.
    try:
        alt.JupyterChart.enable_offline()
    except Exception:  # pragma: no cover - vl-convert missing: charts still work online
        return
    # A plain chart shown in a cell would otherwise use Altair's html renderer, which loads vega
    # from cdn.jsdelivr.net (JupyterLab 4 has no vega-lite 6 renderer of its own): show it as an
    # offline JupyterChart too. Only in a notebook: elsewhere nothing is displayed.
    if in_notebook():
        alt.renderers.enable("jupyter", offline=True)


def leftovers() -> pd.DataFrame:
    """Return the kit's sessions still connected and scratch databases still there (none, normally).

    Run it after interrupting a cell: every experiment ends its sessions and drops its database
    on the way out, so this shows an empty table.
    """
    dsn = db.admin_dsn()
    rows = [{"what": "session", "name": b["application_name"], "database": b["datname"],
             "state": b["state"]} for b in db.leftover_backends(dsn)]
    rows += [{"what": "database", "name": name, "database": name, "state": ""}
             for name in db.scratch_databases(dsn)]
    return pd.DataFrame(rows, columns=["what", "name", "database", "state"])


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def show(obj: Any) -> None:
    """Display obj in a notebook; do nothing elsewhere."""
    if in_notebook():
        from IPython.display import display

        display(obj)


class LiveChart:
    """A chart that redraws from a DataFrame while an experiment runs.

    ``make`` turns the data so far into an Altair chart; ``update(df)`` redraws. In a notebook it
    is an ``alt.JupyterChart`` widget; elsewhere it just keeps the last chart (tests look at it).
    """

    def __init__(self, make: Callable[[pd.DataFrame], Any],
                 data: pd.DataFrame | None = None) -> None:
        self.make = make
        self.data = data if data is not None else pd.DataFrame()
        self.chart = make(self.data)
        self.updates = 0
        self.widget = alt.JupyterChart(self.chart) if in_notebook() else None

    def update(self, data: pd.DataFrame) -> None:
        self.data = data
        self.chart = self.make(data)
        self.updates += 1
        if self.widget is not None:
            self.widget.chart = self.chart

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget if self.widget is not None else self.chart)


class Progress:
    """A progress bar in a notebook, silent elsewhere: ``with progress(n, "runs") as step: step()``."""

    def __init__(self, total: int, description: str = "") -> None:
        self.total, self.done, self.description = total, 0, description
        self.bar = self.label = None
        if in_notebook():
            import ipywidgets as w

            self.bar = w.IntProgress(value=0, min=0, max=max(total, 1), description=description,
                                     bar_style="info")
            self.label = w.Label()
            show(w.HBox([self.bar, self.label], layout=w.Layout(flex_flow="row wrap")))

    def __call__(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.value = min(self.done, self.total)

    def set(self, done: int, total: int | None = None, note: str = "") -> None:
        """Set the progress to done (of total, when it changed), with a note beside the bar."""
        self.done = done
        if total is not None:
            self.total = total
        if self.bar is not None:
            self.bar.max = max(self.total, 1)
            self.bar.value = min(done, self.total)
        if self.label is not None and note:
            self.label.value = note

    def close(self, ok: bool = True) -> None:
        if self.bar is not None:
            self.bar.bar_style = "success" if ok else "danger"


@contextmanager
def progress(total: int, description: str = "") -> Iterator[Progress]:
    bar = Progress(total, description)
    ok = False
    try:
        yield bar
        ok = True
    finally:
        bar.close(ok)


def run_panel(rows: list[list[Any]], action: Callable[[], Any], label: str = "Run") -> Any:
    """Return rows of controls, a Run button after the last, and an output area below.

    Sliders only set values: nothing runs until the button is pressed. ``action()`` runs with
    the output area as its display target, so its charts, tables and errors show there.
    """
    import ipywidgets as w

    button = w.Button(description=label, button_style="primary", icon="play")
    out = w.Output()

    def clicked(_: Any) -> None:
        button.disabled = True  # one run at a time: a second click would start a second run
        out.clear_output()
        try:
            with out:
                action()
        finally:
            button.disabled = False

    button.on_click(clicked)
    # Rows wrap rather than overflow a narrow output area.
    wrap = w.Layout(flex_flow="row wrap")
    return w.VBox([*(w.HBox(r, layout=wrap) for r in rows[:-1]),
                   w.HBox([*rows[-1], button], layout=wrap), out])


def article(finding: str) -> Any:
    """Return the article's numbers for a finding as a two-column table (what, the article)."""
    from .experiments import get

    return _flat(get(finding).article, "the article")


def measured(result: Result) -> Any:
    """Return what ``tenantlab reproduce`` reports from this run, as a two-column table."""
    return _flat(result.measured, "measured here")


def fields(data: dict[str, Any]) -> Any:
    """Return a dict of facts (a policy, a role) as a two-column table: what, value."""
    return _flat(data, "value")


def settings(obj: Any) -> Any:
    """Return a dataclass's fields (an experiment's settings) as a two-column table."""
    import dataclasses

    return _flat(dataclasses.asdict(obj), "value")


def _flat(data: dict[str, Any], column: str) -> Any:
    rows: list[dict[str, str]] = []

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{path}: {k}" if path else str(k), v)
        else:
            rows.append({"what": path.replace("_", " "), column: _cell(value)})

    walk("", data)
    return pd.DataFrame(rows, columns=["what", column]).style.hide(axis="index")


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ", ".join(_cell(v) for v in value)
    return "—" if value is None else str(value)


def controls(knobs: Knobs) -> dict[str, Any]:
    """Return one widget per knob that has a range or choices: sliders, checkboxes, dropdowns."""
    import ipywidgets as w

    # A fixed label column and a fixed width (never shrunk by its row): the track stays about
    # 190 px whatever the label, and two controls fit a 1280 px screen with the file browser open.
    style = {"description_width": "170px"}
    layout = w.Layout(width="400px", flex="0 0 auto")
    out: dict[str, Any] = {}
    for c in knobs.controls():
        value, label = c["value"], c["label"]
        if isinstance(value, bool):
            out[c["name"]] = w.Checkbox(value=value, description=label, style=style,
                                        layout=layout)
        elif c["choices"]:
            out[c["name"]] = w.Dropdown(options=list(c["choices"]), value=value,
                                        description=label, style=style, layout=layout)
        elif isinstance(value, int):
            out[c["name"]] = w.IntSlider(value=value, min=int(c["lo"]), max=int(c["hi"]),
                                         step=int(c["step"] or 1), description=label,
                                         style=style, layout=layout)
        else:
            out[c["name"]] = w.FloatSlider(value=value, min=c["lo"], max=c["hi"],
                                           step=c["step"] or 0.1, description=label,
                                           style=style, layout=layout)
    return out


def explorer(finding: str, show_result: Callable[[Result], Any] | None = None,
             live: Callable[[], Any] | None = None, per_row: int = 2) -> Any:
    """Return the finding's knobs as controls, a Run button, and below it the run's evidence.

    The controls come from the finding's ``Knobs``; Run makes one live run with their values
    and shows the live chart (``live()``), the verdict box, and ``show_result(result)``.
    """
    from IPython.display import display

    from .experiments import get

    entry = get(finding)
    knobs = entry.knobs(full())
    widgets = controls(knobs)

    def action() -> None:
        chosen = type(knobs).of(full(), **{k: c.value for k, c in widgets.items()})
        chart = live() if live else None
        if chart is not None:
            display(chart)
        res = entry.run(chosen, live=chart)
        display(res.verdict)
        if show_result is not None:
            display(show_result(res))

    items = list(widgets.values())
    rows = [items[i:i + per_row] for i in range(0, len(items), per_row)] or [[]]
    return run_panel(rows, action)
