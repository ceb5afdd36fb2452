"""`tenantlab export-worker DIR`: the exported copy alone runs jobs on a fresh database."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tenantlab import db

pytestmark = pytest.mark.slow

# Runs a module of the exported copy with tenantlab made unimportable (the venv has it).
ALONE = textwrap.dedent("""
    import importlib.abc, runpy, sys

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "tenantlab" or name.startswith("tenantlab."):
                raise ImportError(f"refused: {name}")
            return None

    sys.meta_path.insert(0, Refuse())
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
""")

HANDLERS = textwrap.dedent("""
    from shop import handlers, enqueue

    @handlers.register("stamp")
    def stamp(conn, job):
        # The tenant is set locally: the handler's write records which one it saw.
        conn.execute("insert into stamps (job, tenant, note) "
                     "values (%s, current_setting('app.tenant'), %s)",
                     (job.id, job.payload["note"]))

    if __name__ == "__main__":
        import sys, psycopg
        with psycopg.connect(sys.argv[1]) as conn:
            ids = [enqueue(conn, "stamp", tenant=t, payload={"note": f"n{t}"}) for t in (1, 2, 3)]
            ids.append(enqueue(conn, "unheard_of", tenant=4, max_attempts=2))
        print(ids)
""")


def run_alone(directory: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENANTLAB", "DATABASE_URL"))}
    env["PYTHONPATH"] = str(directory)
    return subprocess.run([sys.executable, "-c", ALONE, *args], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def fresh_db(admin_dsn: str):
    """A database with nothing in it (not the template), dropped afterwards."""
    name = f"tenantlab_export_{os.getpid()}_1"
    with db.connect(admin_dsn, "test export", autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with db.connect(admin_dsn, "test export", autocommit=True) as admin:
            admin.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(name)))


def test_the_exported_worker_runs_jobs_alone(tmp_path: Path, admin_dsn: str, fresh_db: str) -> None:
    out = tmp_path / "vendor"
    r = subprocess.run([sys.executable, "-m", "tenantlab", "export-worker", str(out),
                        "--name", "shop"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"PYTHONPATH={out.resolve()} python -m shop --dsn DSN"
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert {"README.md", "shop/__init__.py", "shop/sql/schema.sql", "shop/sql/queries.sql"} <= set(files)
    for p in out.rglob("*.py"):
        assert not re.search(r"^\s*(from|import)\s+tenantlab", p.read_text(), re.M), p
    readme = (out / "README.md").read_text()
    assert "python -m shop schema" in readme and "python -m shop reap" in readme
    (out / "shop_jobs.py").write_text(HANDLERS)

    owner = db.with_db(admin_dsn, fresh_db)
    worker = make_conninfo(owner, user=db.WORKER, password=db.worker_password(admin_dsn))
    r = run_alone(out, "shop", "schema", "--dsn", owner)
    assert r.returncode == 0, r.stderr
    with psycopg.connect(owner, autocommit=True) as c:
        c.execute("create table stamps (job bigint, tenant text, note text)")
        c.execute(sql.SQL("grant select, insert, update, delete on jobs, job_runs, stamps to {}")
                  .format(sql.Identifier(db.WORKER)))
    r = run_alone(out, "shop_jobs", worker)
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout)

    r = run_alone(out, "shop", "--dsn", worker, "--handlers", "shop_jobs", "--until-empty",
                  "--backoff", "0", "--name", "exported")
    assert r.returncode == 0, r.stderr
    with psycopg.connect(owner, autocommit=True) as c:
        jobs = c.execute("select id, status, attempts, last_error from jobs order by id").fetchall()
        stamps = c.execute("select job, tenant, note from stamps order by job").fetchall()
        runs = c.execute("select count(*) from job_runs where worker = 'exported'").fetchone()[0]
        left = c.execute("select count(*) from pg_stat_activity where datname = %s "
                         "and pid <> pg_backend_pid()", (fresh_db,)).fetchone()[0]
    assert [(j[0], j[1], j[2]) for j in jobs[:3]] == [(i, "done", 1) for i in ids[:3]]
    assert stamps == [(ids[0], "1", "n1"), (ids[1], "2", "n2"), (ids[2], "3", "n3")]
    # The unknown kind failed, counted, twice (its max_attempts), with an error naming the known.
    assert (jobs[3][1], jobs[3][2]) == ("dead", 2) and "known: stamp" in jobs[3][3]
    assert runs == 3  # a failed execution's job_runs row rolls back with its work
    assert left == 0  # the worker closed its sessions
