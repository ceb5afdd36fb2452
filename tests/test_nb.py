"""The notebook helpers work without a browser: Run panels, progress bars, verdicts."""

from __future__ import annotations

import sys
from pathlib import Path

import ipywidgets as w
import nbformat
import pytest

from notebooks import NOTEBOOKS
from tenantlab import nb


def _button(panel: w.VBox) -> w.Button:
    return panel.children[-2].children[-1]


def test_run_panel_runs_only_when_pressed_and_one_at_a_time() -> None:
    slider = w.IntSlider(value=3)
    seen: list[tuple[int, bool]] = []
    panel = nb.run_panel([[slider]], lambda: seen.append((slider.value, button.disabled)))
    button = _button(panel)
    slider.value = 5
    assert seen == []  # moving a slider runs nothing
    button.click()
    assert seen == [(5, True)]  # the button is disabled while the run goes on
    assert button.disabled is False


def test_run_panel_shows_an_error_and_frees_the_button() -> None:
    def boom() -> None:
        raise RuntimeError("run failed")

    panel = nb.run_panel([[w.IntSlider()], [w.Checkbox()]], boom, label="Go")
    button = _button(panel)
    assert button.description == "Go" and len(panel.children) == 3
    button.click()  # the output area takes the traceback (as it shows it in a notebook)
    assert button.disabled is False



#: The notebooks' first cell, as stored (notebook 00's; every notebook starts the same way).
FIRST_CELL = next(c for c in nbformat.read(NOTEBOOKS / "00-start-here.ipynb", as_version=4).cells
                  if c.cell_type == "code").source

# (case, environment, what the one line must say, ... once each). {home}: an empty state
# directory; {wrong_password}: the session server's admin URL with another password.
FIRST_CELL_DOWN = [
    ("no embedded server", {"TENANTLAB_HOME": "{home}"}, ["PostgreSQL is not running", "make lab"]),
    ("a state directory that is a file", {"TENANTLAB_HOME": "{file}"}, ["TENANTLAB_HOME"]),
    ("nothing on the URL's port", {"TENANTLAB_DATABASE_URL": "postgresql://u:p@127.0.0.1:1/x"},
     ["cannot connect to PostgreSQL", "TENANTLAB_DATABASE_URL", "run this cell again"]),
    ("a refused login", {"TENANTLAB_DATABASE_URL": "{wrong_password}"},
     ["cannot log in", "TENANTLAB_DATABASE_URL", "run this cell again"]),
    ("no tenantlab in the kernel", {"NO_TENANTLAB": "1"},
     ["no module 'tenantlab'", "\u201ctenantlab (Python 3."]),
]


@pytest.mark.parametrize("case, env, says", FIRST_CELL_DOWN, ids=[c[0] for c in FIRST_CELL_DOWN])
def test_the_first_cell_when_it_cannot_start_is_one_line(
        case: str, env: dict[str, str], says: list[str], admin_dsn: str,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No traceback, and the advice once: what a participant sees when the server is down, the
    login is refused, or the notebook runs on a kernel without the kit."""
    from IPython.core.interactiveshell import InteractiveShell
    from psycopg.conninfo import make_conninfo

    (tmp_path / "a-file").write_text("not a directory\n")
    fill = {"home": str(tmp_path / "no-server-here"), "file": str(tmp_path / "a-file"),
            "wrong_password": make_conninfo(admin_dsn, password="not-the-password")}
    for name in ("TENANTLAB_DATABASE_URL", "DATABASE_URL", "TENANTLAB_HOME", "TENANTLAB_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        if name == "NO_TENANTLAB":  # as in a kernel of another environment
            monkeypatch.setitem(sys.modules, "tenantlab", None)
            monkeypatch.setitem(sys.modules, "tenantlab.nb", None)
        else:
            monkeypatch.setenv(name, value.format(**fill))
    monkeypatch.syspath_prepend(str(NOTEBOOKS))  # the kernel's directory: kit.py
    monkeypatch.delitem(sys.modules, "kit", raising=False)
    shell = InteractiveShell.instance()
    try:
        shell.run_cell(FIRST_CELL)
    finally:
        InteractiveShell.clear_instance()
        sys.modules.pop("kit", None)
    shown = capsys.readouterr().out
    lines = [ln for ln in shown.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in shown, shown
    for words in says:
        assert lines[0].count(words) == 1, (words, lines[0])
