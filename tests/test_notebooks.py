"""Notebooks are stored clean, and notebook 00 runs top to bottom against the suite's server;
run and saved in a checkout with `make`'s filter, it leaves `git status` clean and `git pull` works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from notebooks import (
    NOTEBOOKS,
    again_order,
    clone_with_filter,
    git,
    pull_after_save,
    run_clean,
    run_notebook,
)


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


def test_a_notebook_saved_in_place_by_nbconvert_leaves_git_status_clean(tmp_path: Path) -> None:
    """`jupyter nbconvert --execute --inplace` saves a run into a tracked notebook; with the
    environment's postprocessor (`make`: tenantlab.nbconvert_hook) git sees it unchanged. The run's
    additions are written first (no kernel needed), then nbconvert saves the notebook in place."""
    config = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_nbconvert_config.json"
    assert "tenantlab.nbconvert_hook" in (config.read_text() if config.exists() else ""), (
        f"{config}: nbconvert's post-save refresh is not configured; run `make venv`")
    _, checkout = clone_with_filter(tmp_path)
    name = "notebooks/08-rls-on-the-jobs-table.ipynb"
    nb = nbformat.read(checkout / name, as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.execution_count = 1
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="what a run printed\n")]
    nb.metadata["language_info"] = {"name": "python", "version": "3.12.0"}
    nbformat.write(nb, checkout / name)
    # Without the refresh: "modified" for git status (the size changed), nothing for git diff.
    assert git(checkout, "status", "--porcelain") == f" M {name}\n"
    assert git(checkout, "diff", "--", name) == ""
    nbconvert = Path(sys.executable).parent / "jupyter-nbconvert"
    done = subprocess.run([str(nbconvert), "--to", "notebook", "--inplace", name],
                          cwd=checkout, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter")})
    assert done.returncode == 0, done.stderr
    assert "what a run printed" in (checkout / name).read_text()  # the run stays in the file
    assert git(checkout, "status", "--porcelain") == ""


def test_the_second_pass_is_shuffled_within_its_budget_the_first_cell_first() -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t")] + [
        nbformat.v4.new_code_cell(f"x{i} = {i}") for i in range(1, 9)])
    took = {i: 0.1 for i in range(1, 9)} | {5: 50.0}  # cell 5: an experiment
    order = again_order(nb, took, seed="a.ipynb")
    assert order[0] == 1 and 5 not in order and sorted(order) == [1, 2, 3, 4, 6, 7, 8]
    assert order != sorted(order) and order == again_order(nb, took, seed="a.ipynb")
    assert 5 in again_order(nb, took | {5: 3.0}, seed="a.ipynb", share=1.0)  # affordable now


def test_a_name_a_later_part_reuses_fails_the_second_pass(tmp_path: Path) -> None:
    """Part 2 reuses part 1's name for another thing: top to bottom works, running part 1's
    cell again after part 2 (as a workshop does) does not, and the run says so."""
    from nbclient.exceptions import CellExecutionError

    cells = ["import math", "chart = {'workers': 4}", "chart['workers']",
             "chart = {'tenants': 99}"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "tenantlab", "display_name": "tenantlab",
                                 "language": "python"}
    path = tmp_path / "reused.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(CellExecutionError, match="KeyError"):
        run_notebook(path, timeout=60)
    cells[3] = "tenants_chart = {'tenants': 99}"  # named per part: runs in any order
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)
    done = run_notebook(path, timeout=60)
    assert [o.get("data", {}).get("text/plain") for o in done.cells[2].outputs] == ["4"]
