"""Rewrite one generated section of README.md: the lines between its two HTML comment markers."""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def write(name: str, text: str, readme: Path = README) -> int:
    """Put text between ``<!-- name:start -->`` and ``<!-- name:end -->``; 0, or 1 without them."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    body = readme.read_text()
    if start not in body or end not in body:
        print(f"{readme.name} has no {start} ... {end} markers", file=sys.stderr)
        return 1
    head, rest = body.split(start, 1)
    readme.write_text(f"{head}{start}\n{text}\n{end}{rest.split(end, 1)[1]}")
    print(f"{readme.name}: {name} updated")
    return 0
