"""The kit's kernel cannot be shadowed: the notebooks name the kernel "tenantlab", installed in
the kit's environment; a user-level ``python3`` kernelspec (which Jupyter prefers to the
environment's own) no longer breaks them, and a notebook opened with another kernel says in one
line which kernel to pick."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from notebooks import NOTEBOOKS
from tenantlab import labenv

#: A Python with ipykernel but without tenantlab: every import of the kit fails, as in a
#: participant's own environment.
NO_TENANTLAB = """
import sys
class NoKit:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tenantlab":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoKit())
from ipykernel import kernelapp
kernelapp.launch_new_instance()
"""


#: jupyter_core prefers the environment's kernels to the user's inside a virtualenv, but not
#: everywhere (a pyenv or system Python, conda's base, the variable set to 0): as there.
USER_FIRST = {"JUPYTER_PREFER_ENV_PATH": "0"}


def _user_python3(data: Path) -> None:
    """Install a user-level python3 kernelspec (as `ipykernel install --user` would) in data."""
    spec = data / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", NO_TENANTLAB, "-f", "{connection_file}"],
        "display_name": "Python 3 (user)", "language": "python"}))


def _first_cell(tmp: Path, name: str = "00-start-here.ipynb") -> Path:
    """Return a copy of notebook `name` cut after its first code cell, beside kit.py."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells = nb.cells[:first + 1] + [nbformat.v4.new_code_cell("import sys; print(sys.prefix)")]
    shutil.copy(NOTEBOOKS / "kit.py", tmp / "kit.py")
    nbformat.write(nb, tmp / name)
    return tmp / name


def _execute(path: Path, env: dict[str, str], kernel: str | None = None) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=120, kernel_name=kernel or nb.metadata.kernelspec.name,
                       allow_errors=True, resources={"metadata": {"path": str(path.parent)}}
                       ).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


@pytest.mark.notebook
def test_a_user_python3_kernelspec_does_not_shadow_the_kits_kernel(admin_dsn: str,
                                                                    tmp_path: Path) -> None:
    home = tmp_path / "home"
    data = home / ".local" / "share" / "jupyter"
    _user_python3(data)
    labenv.install()  # what `make` and `tenantlab lab` do
    env = USER_FIRST | {"HOME": str(home), "JUPYTER_DATA_DIR": str(data),
                        "TENANTLAB_DATABASE_URL": admin_dsn, "TENANTLAB_SIZE": "workshop"}
    path = _first_cell(tmp_path)
    # Every notebook names the kit's kernel, installed in this environment (not ~/.local).
    for stored in sorted(NOTEBOOKS.glob("*.ipynb")):
        assert nbformat.read(stored, as_version=4).metadata.kernelspec.name == labenv.KERNEL
    spec = Path(sys.prefix) / "share" / "jupyter" / "kernels" / labenv.KERNEL / "kernel.json"
    assert json.loads(spec.read_text())["argv"][0] == sys.executable
    # Started by the name the notebook gives, as nbconvert and JupyterLab start it.
    nb = _execute(path, env)
    shown = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in shown if o.output_type == "error"], shown
    assert shown[-1].text.strip() == sys.prefix


@pytest.mark.notebook
def test_a_notebook_opened_with_another_kernel_says_which_to_pick(tmp_path: Path) -> None:
    data = tmp_path / "home" / ".local" / "share" / "jupyter"
    _user_python3(data)
    env = USER_FIRST | {"HOME": str(tmp_path / "home"), "JUPYTER_DATA_DIR": str(data)}
    nb = _execute(_first_cell(tmp_path), env, kernel="python3")
    first = next(c for c in nb.cells if c.cell_type == "code")
    errors = [o for o in first.outputs if o.output_type == "error"]
    assert len(errors) == 1, first.outputs
    lines = [ln for ln in errors[0].traceback if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert "no module 'tenantlab'" in lines[0] and "\u201ctenantlab (Python 3." in lines[0], lines
