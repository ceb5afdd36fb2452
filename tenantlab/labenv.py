"""Install what the lab's Jupyter needs in the kit's environment (sys.prefix, not ~/.local).

- The kernel ``tenantlab``: every notebook names it, so a kernelspec a user installed under
  ``python3`` in ~/.local/share/jupyter/kernels (which Jupyter prefers to the environment's own
  ``python3``) cannot shadow the kit's Python; nbconvert and the tests start it by that name.
- JupyterLab's defaults for the lab (``share/jupyter/lab/settings/overrides.json``): no news
  and no update pop-up over the exercises' outputs. A user's own settings still win.

Written by ``make`` (``python -m tenantlab.labenv``) and again by each ``tenantlab lab``; the
files are rewritten only when their content changes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

#: The notebooks' kernel (their metadata's ``kernelspec.name``).
KERNEL = "tenantlab"
DISPLAY_NAME = f"tenantlab (Python {sys.version_info.major}.{sys.version_info.minor})"
#: JupyterLab's notification settings: never ask to fetch news, never check for updates.
OVERRIDES = {"@jupyterlab/apputils-extension:notification":
             {"fetchNews": "false", "checkForUpdates": False}}


def kernelspec() -> dict[str, Any]:
    """Return the kit's kernelspec: this environment's Python running ipykernel."""
    return {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": DISPLAY_NAME, "language": "python",
            "metadata": {"debugger": True}, "env": {}}


def _write(path: Path, data: dict[str, Any]) -> Path:
    text = json.dumps(data, indent=1) + "\n"
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Whole or not at all: a JupyterLab or a test starting meanwhile reads the old file.
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def install(prefix: Path | None = None) -> list[Path]:
    """Write the kit's kernelspec and JupyterLab's overrides under `prefix`; return the files."""
    share = (prefix or Path(sys.prefix)) / "share" / "jupyter"
    kernel = _write(share / "kernels" / KERNEL / "kernel.json", kernelspec())
    overrides = share / "lab" / "settings" / "overrides.json"
    try:
        merged = json.loads(overrides.read_text()) if overrides.exists() else {}
    except ValueError:
        merged = {}
    for plugin, values in OVERRIDES.items():
        merged[plugin] = {**merged.get(plugin, {}), **values}
    return [kernel, _write(overrides, merged)]


if __name__ == "__main__":
    for path in install():
        print(f"jupyter: {path}")
