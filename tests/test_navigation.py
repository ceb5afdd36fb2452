"""Every notebook carries previous / contents / next links, and 00 lists every notebook."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import navigation  # noqa: E402


def test_navigation_is_up_to_date() -> None:
    assert navigation.main(["--check"]) == 0, "run: python tools/navigation.py"


def test_start_here_lists_every_notebook() -> None:
    paths = sorted(navigation.NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"))
    start = nbformat.read(navigation.NOTEBOOKS / navigation.CONTENTS_FILE, as_version=4)
    contents = next(c.source for c in start.cells if c.source.startswith(navigation.CONTENTS))
    for path in paths:
        assert f"]({path.name})" in contents, f"00 does not link {path.name}"
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        navs = [c for c in nb.cells if c.source.startswith(navigation.NAV)]
        assert len(navs) == 2 and navs[0] is nb.cells[1] and navs[1] is nb.cells[-1], path.name


def test_navigation_is_idempotent(tmp_path: Path, monkeypatch) -> None:
    for p in navigation.NOTEBOOKS.glob("*.ipynb"):
        (tmp_path / p.name).write_text(p.read_text())
    monkeypatch.setattr(navigation, "NOTEBOOKS", tmp_path)
    navigation.main([])
    once = {p.name: p.read_text() for p in tmp_path.glob("*.ipynb")}
    assert navigation.main(["--check"]) == 0
    navigation.main([])
    assert {p.name: p.read_text() for p in tmp_path.glob("*.ipynb")} == once
