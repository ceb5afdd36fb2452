"""The package: psycopg its only dependency, ``__all__`` its whole surface, typed, standalone."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jobqueue

DIST = Path(__file__).resolve().parent.parent  # jobqueue/: pyproject, README, src, tests
#: The public modules: each has an ``__all__`` of its own.
MODULES = ("cli", "migrations", "ops", "options", "queries")

IMPORTS = """
import json, sys
import psycopg
before = set(sys.modules)
import jobqueue, jobqueue.cli
new = {m.split(".")[0] for m in set(sys.modules) - before}
print(json.dumps(sorted(new - set(sys.stdlib_module_names))))
"""


def test_it_imports_the_standard_library_and_psycopg_only() -> None:
    r = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True,
                       timeout=60, check=True)
    assert json.loads(r.stdout) == ["jobqueue"]


def test_all_is_the_surface_and_every_name_in_it_exists() -> None:
    assert len(set(jobqueue.__all__)) == len(jobqueue.__all__)
    missing = [n for n in jobqueue.__all__ if not hasattr(jobqueue, n)]
    assert missing == []
    for name in MODULES:
        assert name in jobqueue.__all__
        module = importlib.import_module(f"jobqueue.{name}")
        assert [n for n in module.__all__ if not hasattr(module, n)] == [], name


def test_it_ships_typed_with_its_sql() -> None:
    files = resources.files("jobqueue")
    assert files.joinpath("py.typed").is_file()
    assert files.joinpath("sql", "queries.sql").is_file()
    assert any(p.name.startswith("0001_") for p in files.joinpath("migrations").iterdir())


def test_nothing_in_the_distribution_names_the_workshop_kit_it_came_from() -> None:
    kit = "tenant" + "lab"  # spelled apart: this file is inside the distribution too
    named = [str(p.relative_to(DIST)) for p in DIST.rglob("*")
             if p.is_file() and p.suffix in (".py", ".sql", ".md", ".toml", ".txt", ".cfg")
             and "egg-info" not in str(p) and kit in p.read_text().lower()]
    assert named == []
