"""The notebook helpers work without a browser: Run panels, progress bars, verdicts."""

from __future__ import annotations

from pathlib import Path

import ipywidgets as w
import pytest

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



def test_the_first_cell_with_the_server_down_is_one_line(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No traceback, and the advice once: what a participant sees when the server is down."""
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.delenv("TENANTLAB_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("TENANTLAB_HOME", str(tmp_path / "no-server-here"))
    shell = InteractiveShell.instance()
    try:
        shell.run_cell("import tenantlab.nb as nb\nlab = nb.setup()")
    finally:
        InteractiveShell.clear_instance()
    shown = capsys.readouterr().out
    lines = [ln for ln in shown.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in shown, shown
    assert "PostgreSQL is not running" in lines[0] and lines[0].count("make lab") == 1
