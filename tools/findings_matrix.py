"""Write the README's findings matrix from a `tenantlab reproduce --json` file.

    python tools/findings_matrix.py reproduce.json        # rewrites README.md between markers
    python tools/findings_matrix.py reproduce.json --print
"""

from __future__ import annotations

import sys

import readme_section


def matrix(result: dict) -> str:
    """Return the Markdown table: one row per finding, Hermitage-style ✓ / ✗."""
    server = result["server_version"]
    repeat = result.get("repeat", 1)
    runs = (f", every finding run {repeat} times: each number is the range over the runs, "
            "and the last column says in how many runs it reproduced" if repeat > 1 else "")
    lines = [f"Measured by `tenantlab reproduce{f' --repeat {repeat}' if repeat > 1 else ''}` "
             f"on PostgreSQL {server} "
             f"({'full' if result.get('full') else 'workshop'} size{runs}).", "",
             f"| finding | the article | measured here | PostgreSQL {server.split()[0]} |",
             "|---|---|---|---|"]
    for finding, f in result["findings"].items():
        mark = "✓" if f["reproduced"] else "✗"
        if f.get("runs", 1) > 1:
            mark += f" {f['reproduced_runs']} of {f['runs']}"
        cells = [f"`{finding}`", f["claim"], f.get("summary", ""), mark]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return readme_section.from_json("findings-matrix", __doc__, matrix, argv)


if __name__ == "__main__":
    sys.exit(main())
