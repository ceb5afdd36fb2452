"""Print a notebook from stdin as the repository stores it: git's clean filter for notebooks/.

Set up by tools/setup_git_filter.sh (`make`, the compose file's git-filter service, the README's
conda steps). Whatever a run or a save added is dropped, so a notebook that was run and saved
shows no change in `git status` and never blocks a `git pull`:

- outputs and execution counts;
- notebook metadata beyond what the notebooks are written with: the kernel is stored as
  ipykernel's ``python3`` (JupyterLab and VS Code write the kernel they ran), ``language_info``
  as its name only (a run adds the version, mimetype, ...), and widget state (``widgets``) or
  any editor's own key (``vscode``, ``toc``, ...) goes;
- cell metadata that records a run or a view: ``execution`` timings, ``collapsed``,
  ``scrolled``, ``jupyter.source_hidden``/``outputs_hidden``, ``ExecuteTime``, ``trusted``, ...
  An author's cell metadata stays (``tags``, ``editable``, ``deletable``, ``name``,
  ``slideshow``, a raw cell's ``format``).

Cell ids are kept as they are: they are stable across runs and saves, and git sees them only
when a cell is added. The text is written as nbformat writes it (json, keys sorted, indent 1,
UTF-8, sources as lists of lines, final newline), so a stored notebook passes through byte for
byte. Standard library only (it runs under the host's python3, also for docker compose users).
Not JSON (a file mid-edit): passed through unchanged.
"""

from __future__ import annotations

import json
import sys

#: What a notebook of this repository runs on, whatever kernel a participant picked.
KERNELSPEC = {"display_name": "tenantlab (Python 3.12)", "language": "python", "name": "tenantlab"}
NOTEBOOK_KEYS = {"kernelspec", "language_info", "title", "authors"}
CELL_KEYS = {"tags", "editable", "deletable", "name", "slideshow", "format"}


def _lines(source: object) -> object:
    # nbformat's split_lines: a multi-line string is stored as a list of lines.
    return source.splitlines(keepends=True) if isinstance(source, str) else source


def strip(text: str) -> str:
    """Return the notebook text as stored; text that is not a notebook, unchanged."""
    try:
        nb = json.loads(text)
        cells = nb["cells"]
        meta = nb.get("metadata", {})
        if not isinstance(cells, list) or not isinstance(meta, dict):
            return text
    except (ValueError, KeyError, TypeError, AttributeError):
        return text
    for cell in cells:
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell["metadata"] = {k: v for k, v in cell.get("metadata", {}).items() if k in CELL_KEYS}
        cell["source"] = _lines(cell.get("source", []))
    kept = {k: v for k, v in meta.items() if k in NOTEBOOK_KEYS}
    language = (kept.get("kernelspec") or {}).get("language") or \
        (kept.get("language_info") or {}).get("name") or "python"
    if language == "python":
        kept["kernelspec"] = dict(KERNELSPEC)
    if "kernelspec" in kept or "language_info" in kept:
        kept["language_info"] = {"name": language}
    nb["metadata"] = kept
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


if __name__ == "__main__":
    # Bytes in and out: the stored text is UTF-8 whatever the locale of the git that runs us.
    data = sys.stdin.buffer.read().decode("utf-8", errors="surrogateescape")
    sys.stdout.buffer.write(strip(data).encode("utf-8", errors="surrogateescape"))
