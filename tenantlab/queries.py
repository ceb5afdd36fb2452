"""Load the schema and the named queries: the production worker's, then the lab's ``sql/lab``.

The corrected worker's SQL lives with it (the ``jobqueue`` distribution: ``migrations/*.sql`` and
``sql/queries.sql``); the lab's is in ``sql/lab/*.sql``, one file per concern, DDL first, then
queries, each introduced by ``-- name: NAME``. The template database is built by the
production migrations (its tables in the schema ``jobqueue``, which the lab's databases put
on their ``search_path``), then the lab's DDL in ``LAB_ORDER``. Python looks queries up by name and
passes parameters; it never formats SQL.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from jobqueue import migrations
from jobqueue import queries as production

from . import settings
from .errors import TenantlabError

#: The checkout's (or the installed package's) SQL; TENANTLAB_SQL replaces it.
DEFAULT_SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
#: Lab files whose DDL must run in this order (after the production schema); the rest hold
#: queries only.
LAB_ORDER = ("roles.sql", "tenants.sql", "jobs.sql")


def files() -> list[Path]:
    """Return every SQL file, in the order the template applies their DDL."""
    # Read when needed, not at import: a bad TENANTLAB_SQL is then the CLI's one line.
    lab_dir = (settings.sql_dir() or DEFAULT_SQL_DIR) / "lab"
    if not lab_dir.is_dir():
        raise TenantlabError(f"no sql/lab directory at {lab_dir}: set TENANTLAB_SQL to a "
                             "directory holding lab/*.sql")
    lab = sorted(lab_dir.glob("*.sql"), key=lambda p: (p.name not in LAB_ORDER,
                                                       LAB_ORDER.index(p.name)
                                                       if p.name in LAB_ORDER else 0, p.name))
    return [production.SQL_DIR / "queries.sql", *lab]


@cache
def _parse() -> tuple[tuple[tuple[str, str], ...], dict[str, str]]:
    ddl, queries = [], {}
    for path in files():
        text, named = production.parse(path.read_text())
        ddl.append((path.name, text))
        for name, body in named.items():
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice (second time in {path.name})")
            queries[name] = body
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
    for path in [*(p for _, _, p in migrations.available()), *files()]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _only_comments(text: str) -> bool:
    return all(not ln.strip() or ln.lstrip().startswith("--") for ln in text.splitlines())
