"""The fault matrix (jobqueue_faults.py): in process on the lab, and exported, from a bare venv.

One handler's statement timeout, lock timeout, deadlock or serialization failure fails only its
job, counted and recorded, in every mode; a killed connection is an outage the worker survives,
and its job is retried. The slow test runs the same script against an exported copy
(``shop``) from a venv holding only psycopg, on a fresh database migrated by its owner.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jobqueue_faults as faults
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tenantlab import db
from tenantlab.export import export

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(faults.__file__).resolve()


@pytest.mark.parametrize(("fault", "mode"), faults.CELLS,
                         ids=[f"{f}-{m}" for f, m in faults.CELLS])
def test_one_handlers_fault_fails_only_its_job(scratch: db.Scratch, fault: str, mode: str) -> None:
    cell = faults.run_cell(importlib.import_module("jobqueue"), scratch.worker,
                           fault, mode)
    assert cell.ok, cell.explain()


def locked_versions() -> list[str]:
    """Return psycopg's pins from requirements.lock (psycopg and psycopg-binary)."""
    text = (ROOT / "requirements.lock").read_text()
    pins = re.findall(r"^(psycopg(?:-binary)?==[^\s;]+)", text, re.M)
    assert len(pins) == 2, f"requirements.lock should pin psycopg and psycopg-binary: {pins}"
    return pins


@pytest.fixture
def bare_venv(tmp_path: Path) -> Path:
    """A venv with psycopg only (and what psycopg itself needs); return its python."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    r = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *locked_versions()],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return python


@pytest.fixture
def fresh_roles(admin_dsn: str) -> Iterator[tuple[str, str]]:
    """A new database (not the lab's template) owned by a login owner role, and a worker role.

    Yield the owner's and the worker's DSNs; drop all three afterwards.
    """
    tag = f"{os.getpid()}_1"
    name, owner, worker = f"tenantlab_faults_{tag}", f"faults_owner_{tag}", f"faults_worker_{tag}"
    password = secrets.token_urlsafe(18)
    ident = sql.Identifier
    with db.connect(admin_dsn, "test faults", autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(ident(name)))
        for role in (owner, worker):
            admin.execute(sql.SQL("drop role if exists {}").format(ident(role)))
            # An ordinary role: not superuser, no BYPASSRLS, no CREATEDB.
            admin.execute(sql.SQL("create role {} login password {}").format(
                ident(role), sql.Literal(password)))
        admin.execute(sql.SQL("create database {} owner {}").format(ident(name), ident(owner)))
    base = db.with_db(admin_dsn, name)
    try:
        yield (make_conninfo(base, user=owner, password=password),
               make_conninfo(base, user=worker, password=password))
    finally:
        with db.connect(admin_dsn, "test faults", autocommit=True) as admin:
            admin.execute(sql.SQL("drop database if exists {} with (force)").format(ident(name)))
            for role in (owner, worker):
                admin.execute(sql.SQL("drop role if exists {}").format(ident(role)))


def alone(python: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the bare venv's python with only the exported package on its path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TENANTLAB", "DATABASE_URL", "PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(cwd)
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_the_exported_worker_passes_the_matrix_from_a_bare_venv(
        tmp_path: Path, bare_venv: Path, fresh_roles: tuple[str, str]) -> None:
    owner, worker = fresh_roles
    vendor = tmp_path / "vendor"
    export(vendor, name="shop")
    r = alone(bare_venv, "-c", "import tenantlab", cwd=vendor)
    assert r.returncode != 0, "the bare venv must not see the kit"

    r = alone(bare_venv, "-m", "shop", "migrate", "--dsn", owner, cwd=vendor)
    assert r.returncode == 0, r.stderr
    worker_role = conninfo_to_dict(worker)["user"]
    with psycopg.connect(owner, autocommit=True) as c:
        # The worker's grants, as the package's README lists them.
        for grant in ("grant usage on schema jobqueue to {}",
                      "grant select, insert, update, delete on jobqueue.jobs, jobqueue.job_runs to {}",
                      "grant select, update on jobqueue.claimable to {}",
                      "grant select on jobqueue.migrations to {}",
                      "grant select, insert, update on jobqueue.tenant_turns to {}",
                      "grant select, insert, update, delete on jobqueue.workers to {}"):
            c.execute(sql.SQL(grant).format(sql.Identifier(str(worker_role))))

    r = alone(bare_venv, str(SCRIPT), "--package", "shop", "--dsn", worker, "--json", cwd=vendor)
    assert r.returncode in (0, 1), r.stderr
    report = json.loads(r.stdout)
    failed = [f"{c['fault']} x {c['mode']}: {'; '.join(c['problems'])}"
              for c in report["cells"] if not c["ok"]]
    assert len(report["cells"]) == 15
    assert not failed, "\n".join(failed)
    assert r.returncode == 0
