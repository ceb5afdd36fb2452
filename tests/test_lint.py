"""The tools keep the habits: ruff on everything, mypy on the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_ruff() -> None:
    done = subprocess.run([BIN / "ruff", "check", "tenantlab", "tests", "tools", "jobqueue"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_mypy() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "tenantlab"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]


def test_mypy_strict_on_the_production_worker() -> None:
    # What engineers take to production is held to mypy's strictest setting (as psycopg is):
    # its own configuration says so (jobqueue/pyproject.toml: strict = true).
    assert "strict = true" in (ROOT / "jobqueue" / "pyproject.toml").read_text()
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT / "jobqueue",
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
