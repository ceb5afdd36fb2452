"""After JupyterLab saves a notebook, tell git that a run changed nothing it stores.

Git's clean filter (tools/strip_outputs.py) hides a run from `git diff`, but git trusts a file's
size before its content: a notebook whose size changed since git last looked counts as modified
in `git status`, and `git pull` refuses to overwrite it ("Your local changes ... would be
overwritten by merge"), although nothing that git stores changed. So after each save, when git
sees no difference through the filter, the notebook is added again: git records its new size and
time, and the stored content stays what it was. A notebook with a real edit is left alone, and so
is one that git does not track.

JupyterLab calls ``post_save`` (``ContentsManager.post_save_hook``): ``tenantlab lab`` (``make
lab``, the conda steps) and docker compose's lab service configure it. It never fails a save:
without git, a checkout or the filter, nothing happens.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

#: What JupyterLab is started with (`tenantlab lab`, docker-compose.yml).
JUPYTER_OPTION = "--ContentsManager.post_save_hook=tenantlab.gitsave.post_save"


def post_save(model: Any = None, os_path: str = "", contents_manager: Any = None) -> None:
    """JupyterLab's post-save hook: see the module's docstring."""
    refresh(Path(os_path))


def refresh(path: Path) -> bool:
    """Add `path` again when git sees no change in it through the filter; return True if it did."""
    if path.suffix != ".ipynb":
        return False

    def git(*args: str) -> int:
        return subprocess.run(["git", "-C", str(path.parent), *args], capture_output=True,
                              timeout=30).returncode

    try:
        return (git("ls-files", "--error-unmatch", "--", path.name) == 0  # tracked
                and git("diff", "--quiet", "--", path.name) == 0  # no change through the filter
                and git("add", "--", path.name) == 0)  # so this stages nothing, only the stat
    except (OSError, subprocess.SubprocessError):
        return False
