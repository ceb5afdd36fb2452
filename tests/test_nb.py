"""The notebook helpers work without a browser: Run panels, progress bars, verdicts."""

from __future__ import annotations

import ipywidgets as w

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

