"""Print a notebook from stdin without outputs: git's clean filter for notebooks/ (see Makefile).

Writes the repository's own format (json, indent 1, UTF-8, final newline), so a notebook stored
clean passes through byte for byte and only what JupyterLab added on a run is dropped: outputs,
execution counts, execution timing. Not JSON (a file mid-edit): passed through unchanged.
"""

from __future__ import annotations

import json
import sys


def strip(text: str) -> str:
    """Return the notebook text without outputs; text that is not a notebook, unchanged."""
    try:
        nb = json.loads(text)
        cells = nb["cells"]
    except (ValueError, KeyError, TypeError):
        return text
    for cell in cells:
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(strip(sys.stdin.read()))
