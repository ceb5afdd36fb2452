"""After JupyterLab saves a notebook, tell git that a run changed nothing it stores.

Git's clean filter (tools/strip_outputs.py) hides a run from `git diff`, but git trusts a file's
size before its content: a notebook whose size changed since git last looked counts as modified
in `git status`, and `git pull` refuses to overwrite it ("Your local changes ... would be
overwritten by merge"), although nothing that git stores changed. So after each save, when git
sees no difference through the filter, the notebook is added again: git records its new size and
time, and the stored content stays what it was. A notebook with a real edit is left alone, and so
is one that git does not track.

JupyterLab calls ``post_save`` (``ContentsManager.post_save_hook``): ``tenantlab lab`` (``make
lab``, the conda steps) and docker compose's lab service configure it. nbconvert (``jupyter
nbconvert --execute --inplace``) calls ``tenantlab.nbconvert_hook`` after it writes a notebook:
``make`` configures it in the environment (``python -m tenantlab.gitsave``). It never fails a save:
without git, a checkout or the filter, nothing happens.
"""

from __future__ import annotations

import json
import subprocess
import sys
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


#: The setting, in the environment's nbconvert configuration (sys.prefix/etc/jupyter).
NBCONVERT_KEY = ("NbConvertApp", "postprocessor_class")


def install(prefix: Path | None = None) -> Path:
    """Make nbconvert in this environment call tenantlab.nbconvert_hook (its other settings kept);
    return the configuration file written."""
    path = (prefix or Path(sys.prefix)) / "etc" / "jupyter" / "jupyter_nbconvert_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        config = {}
    section, key = NBCONVERT_KEY
    config.setdefault(section, {})[key] = "tenantlab.nbconvert_hook.PostSave"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path


if __name__ == "__main__":
    print(f"nbconvert: a notebook it saves in place stays unchanged for git ({install()})")
