"""Load the schema and the named queries from ``sql/*.sql``.

Each file holds one concern: its DDL first, then queries, each introduced by ``-- name: NAME``.
Python looks queries up by name and passes parameters; it never formats SQL.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from pathlib import Path

from . import settings

SQL_DIR = settings.sql_dir() or Path(__file__).resolve().parent.parent / "sql"
_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@cache
def _parse() -> tuple[tuple[tuple[str, str], ...], dict[str, str]]:
    if not SQL_DIR.is_dir():
        raise FileNotFoundError(f"no sql directory at {SQL_DIR}: set TENANTLAB_SQL")
    ddl, queries = [], {}
    for path in sorted(SQL_DIR.glob("*.sql")):
        parts = _NAME.split(path.read_text())
        ddl.append((path.name, parts[0]))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice (second time in {path.name})")
            # Drop the trailing comment lines that introduce the next query.
            lines = body.strip().splitlines()
            while lines and lines[-1].lstrip().startswith("--"):
                lines.pop()
            queries[name] = "\n".join(lines).strip()
    return tuple(ddl), queries


def q(name: str) -> str:
    """Return the named query's text."""
    queries = _parse()[1]
    try:
        return queries[name]
    except KeyError:
        raise KeyError(f"no query named {name!r}; known: {', '.join(sorted(queries))}") from None


def names() -> list[str]:
    return sorted(_parse()[1])


def schema() -> list[tuple[str, str]]:
    """Return (file, DDL) pairs in file order: what builds the template database."""
    return [(f, d) for f, d in _parse()[0] if d.strip() and not _only_comments(d)]


def schema_version() -> str:
    """Return a short hash of every SQL file: the template is rebuilt when it changes."""
    h = hashlib.sha256()
    for path in sorted(SQL_DIR.glob("*.sql")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _only_comments(text: str) -> bool:
    return all(not ln.strip() or ln.lstrip().startswith("--") for ln in text.splitlines())
