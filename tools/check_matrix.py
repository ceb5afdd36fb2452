"""Write the README's queue matrix from a `tenantlab check --json` file.

    python tools/check_matrix.py docs/check.json          # rewrites README.md between markers
    python tools/check_matrix.py docs/check.json --print
"""

from __future__ import annotations

import sys
from pathlib import Path

import readme_section

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tenantlab.check.matrix import markdown  # noqa: E402


def matrix(result: dict) -> str:
    """Return the Markdown matrix: rows queue × setting, Hermitage-style cells, the witnesses."""
    return markdown(result)


def main(argv: list[str] | None = None) -> int:
    return readme_section.from_json("check-matrix", __doc__, matrix, argv)


if __name__ == "__main__":
    sys.exit(main())
