"""Insert previous / contents / next links into every notebook, and the contents list into 00.

Idempotent: run it again and nothing changes. `--check` exits 1 when a notebook is out of date
(tests/test_navigation.py runs it so). Cells it owns start with an HTML marker comment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAV = "<!--NAVIGATION-->"
CONTENTS = "<!--CONTENTS-->"
CONTENTS_FILE = "00-start-here.ipynb"


def title(nb: nbformat.NotebookNode, path: Path) -> str:
    """Return the notebook's first heading without its '#' and number, e.g. 'Start here'."""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and not cell.source.startswith(("<!--",)):
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    text = line[2:].strip()
                    return text.split("·", 1)[1].strip() if "·" in text else text
    return path.stem


def nav_cell(paths: list[Path], titles: dict[Path, str], i: int) -> str:
    parts = []
    if i > 0:
        prev = paths[i - 1]
        parts.append(f"[< {prev.stem[:2]} · {titles[prev]}]({prev.name})")
    parts.append(f"[Contents]({CONTENTS_FILE}#The-notebooks)")
    if i + 1 < len(paths):
        nxt = paths[i + 1]
        parts.append(f"[{nxt.stem[:2]} · {titles[nxt]} >]({nxt.name})")
    return NAV + "\n" + " | ".join(parts)


def contents_cell(paths: list[Path], titles: dict[Path, str], findings: dict[Path, str]) -> str:
    rows = [f"| {p.stem[:2]} | [{titles[p]}]({p.name}) | {findings.get(p, '')} |" for p in paths]
    return "\n".join([CONTENTS, "## The notebooks", "", "| # | notebook | finding |",
                      "|---|---|---|", *rows, "",
                      "Nothing needs cleaning up between notebooks: every experiment drops its "
                      "database and ends its processes, also when you interrupt a cell."])


# Which finding ids each notebook reproduces (the ids of FINDINGS.md and `tenantlab reproduce`).
FINDINGS = {"00": "set-up", "01": "`leak`", "02": "`reset`", "03": "`poison`", "04": "`crash`",
            "05": "`overrun`", "06": "`vacuum`", "07": "`horizon`", "08": "`rls-jobs`",
            "09": "all of them, at once", "10": "`vanish`, `restart`",
            "11": "`workers`, `noisy-neighbour`", "12": "`pgbouncer`",
            "13": "`tenantlab check`: every failure mode, against queue libraries"}


def update(paths: list[Path]) -> dict[Path, nbformat.NotebookNode]:
    """Return the notebooks whose navigation changed, updated."""
    books = {p: nbformat.read(p, as_version=4) for p in paths}
    titles = {p: title(nb, p) for p, nb in books.items()}
    findings = {p: FINDINGS.get(p.stem[:2], "") for p in books}
    changed = {}
    for i, (path, nb) in enumerate(books.items()):
        before = nbformat.writes(nb)
        cells = [c for c in nb.cells if not c.source.startswith((NAV, CONTENTS))]
        nav = nav_cell(paths, titles, i)
        # After the title cell, and at the very end.
        cells.insert(1, _markdown(nav, "nav-top"))
        if path.name == CONTENTS_FILE:
            cells.append(_markdown(contents_cell(paths, titles, findings), "contents"))
        cells.append(_markdown(nav, "nav-bottom"))
        nb.cells = cells
        if nbformat.writes(nb) != before:
            changed[path] = nb
    return changed


def _markdown(source: str, cell_id: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_markdown_cell(source)
    cell.id = cell_id  # fixed ids: a re-run writes the same file
    return cell


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true", help="exit 1 if any notebook is out of date")
    args = p.parse_args(argv)
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))
    changed = update(paths)
    if args.check:
        for path in changed:
            print(f"{path.name}: navigation out of date (run python tools/navigation.py)")
        return 1 if changed else 0
    for path, nb in changed.items():
        nbformat.write(nb, path)
        print(f"updated {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
