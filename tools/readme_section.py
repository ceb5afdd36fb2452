"""Rewrite one generated section of README.md: the lines between its two HTML comment markers."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def from_json(name: str, doc: str, build: Callable[[Any], str],
              argv: list[str] | None = None) -> int:
    """The command line of a tool that turns a JSON file into the README section `name`."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("json_file")
    p.add_argument("--print", action="store_true", help="print the table instead of writing it")
    args = p.parse_args(argv)
    text = build(json.loads(Path(args.json_file).read_text()))
    if args.print:
        print(text)
        return 0
    return write(name, text)
