"""Load this package's named queries, ``sql/queries.sql`` (the tables: ``migrations/``).

A query starts at a ``-- name: NAME`` line; Python looks it up by name and passes parameters,
never formats SQL.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

__all__ = ["SQL_DIR", "parse", "q"]

SQL_DIR = Path(__file__).resolve().parent / "sql"
_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def parse(text: str) -> tuple[str, dict[str, str]]:
    """Split SQL text into its leading DDL and its named queries (comments before a name dropped)."""
    parts = _NAME.split(text)
    named = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = body.strip().splitlines()
        while lines and lines[-1].lstrip().startswith("--"):
            lines.pop()  # the comment that introduces the next query
        named[name] = "\n".join(lines).strip()
    return parts[0], named


@cache
def _queries() -> dict[str, str]:
    return parse((SQL_DIR / "queries.sql").read_text())[1]


def q(name: str) -> str:
    """Return the named query's text."""
    try:
        return _queries()[name]
    except KeyError:
        raise KeyError(f"no query named {name!r}; known: {', '.join(sorted(_queries()))}") from None

