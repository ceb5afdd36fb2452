"""Notebooks are stored clean, and notebook 00 runs top to bottom against the suite's server;
run and saved in a checkout with `make`'s filter, it leaves `git status` clean and `git pull` works."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from notebooks import NOTEBOOKS, pull_after_save, run_clean


def test_notebooks_are_stored_without_outputs() -> None:
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert paths, "no notebooks found"
    for path in paths:
        nb = json.loads(path.read_text())
        dirty = [i for i, c in enumerate(nb["cells"])
                 if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
        assert not dirty, f"{path.name}: cells {dirty} have stored outputs"


@pytest.mark.notebook
def test_start_here_runs_top_to_bottom(admin_dsn: str, tmp_path: Path) -> None:
    nb, text = run_clean("00-start-here.ipynb", admin_dsn)
    assert "✓ tenant 1 sees 20,000 invoices: 20,000" in text
    assert "✗" not in text
    leftovers = next(c for c in nb.cells if c.source == "nb.leftovers()")
    shown = leftovers.outputs[0]["data"]["text/plain"]
    assert shown.startswith("Empty DataFrame"), shown
    # Saved in place as JupyterLab saves it (nbformat): outputs, language_info, the widgets'
    # state, cell timings. With the filter set up (`make`), git sees no change and pulls.
    assert any(c.outputs for c in nb.cells if c.cell_type == "code")
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert nb.metadata.language_info.get("version") and "execution" in first_code.metadata
    assert pull_after_save(tmp_path, "00-start-here.ipynb", nbformat.writes(nb) + "\n") == ""
