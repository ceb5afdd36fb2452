"""`tenantlab export-worker DIR`: the exported copy alone runs jobs on a fresh database.

The export is something an application vendors: it writes only inside ``DIR/NAME``, replaces only
what an earlier export wrote, carries its migrations and its README, and that README's grants
are enough (the end-to-end test runs them verbatim).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tenantlab import db
from tenantlab.export import MARKER

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
    import uuid
    from shop import handlers, enqueue

    @handlers.register("stamp")
    def stamp(conn, job):
        # The tenant is set locally: the handler's write records which one it saw.
        conn.execute("insert into stamps (job, tenant, note) "
                     "values (%s, current_setting('app.tenant'), %s)",
                     (job.id, job.payload["note"]))

    if __name__ == "__main__":
        import json, sys, psycopg
        tenants = json.loads(sys.argv[2])
        if sys.argv[3] == "uuid":
            tenants = [uuid.UUID(t) for t in tenants]
        with psycopg.connect(sys.argv[1]) as conn:
            ids = [enqueue(conn, "stamp", tenant=t, payload={"note": f"n{i}"})
                   for i, t in enumerate(tenants[:3])]
            ids.append(enqueue(conn, "unheard_of", tenant=tenants[3], max_attempts=2))
        print(ids)
""")


def export_worker(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tenantlab", "export-worker", str(out), *args],
                          capture_output=True, text=True, timeout=60)


def run_alone(directory: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENANTLAB", "DATABASE_URL"))}
    env["PYTHONPATH"] = str(directory)
    return subprocess.run([sys.executable, "-c", ALONE, *args], cwd=directory, env=env,
                          capture_output=True, text=True, timeout=timeout)


def readme_grants(readme: str, role: str) -> list[str]:
    """Return the README's `grant ... to ROLE;` statements (its code blocks, as written)."""
    return [line.split("--")[0].strip() for line in readme.splitlines()
            if line.startswith("    grant ") and line.split("--")[0].rstrip().endswith(f" to {role};")]


# --- where it writes --------------------------------------------------------------------------

def test_the_readme_is_inside_the_package_with_its_migrations(tmp_path: Path) -> None:
    r = export_worker(tmp_path, "--name", "shop")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "README.md").exists()  # DIR is the application's; only DIR/NAME is ours
    package = tmp_path / "shop"
    assert (package / "README.md").is_file() and (package / MARKER).is_file()
    migrations = sorted(p.name for p in (package / "migrations").glob("*.sql"))
    assert migrations and migrations[0].startswith("0001_"), migrations
    readme = (package / "README.md").read_text()
    text = " ".join(readme.split())
    for needed in ("jobqueue migrate --dsn", "python -m thatname", "--tenant-type", "uuid",
                   "grant usage on schema jobqueue to app_worker;",
                   "grant insert, select (id, unique_key, status) on jobqueue.jobs to app;",
                   "pg_notify",
                   "owns the schema", "a second one stops it at once", "`2` bad configuration",
                   "every third of the lease", "from its first write until its finish commits",
                   "claims only the kinds it has handlers for"):
        assert needed in text, needed


def test_a_non_empty_target_that_no_export_wrote_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "shop"
    mine.mkdir()
    (mine / "__init__.py").write_text("# the application's own package\n")
    r = export_worker(tmp_path, "--name", "shop")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--force" in r.stderr and str(mine) in r.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["__init__.py"]
    assert (mine / "__init__.py").read_text() == "# the application's own package\n"


def test_a_new_export_replaces_an_earlier_one_and_only_what_it_wrote(tmp_path: Path) -> None:
    assert export_worker(tmp_path, "--name", "shop").returncode == 0
    package = tmp_path / "shop"
    # What a later package version no longer ships (listed as written), and what a user added.
    (package / "sql" / "retired.sql").write_text("-- shipped by an older export\n")
    with (package / MARKER).open("a") as f:
        f.write("sql/retired.sql\n")
    (package / "LOCAL_NOTES.md").write_text("ours\n")
    (package / "__init__.py").write_text("# edited in place\n")

    r = export_worker(tmp_path, "--name", "shop")
    assert r.returncode == 0, r.stderr
    assert not (package / "sql" / "retired.sql").exists()
    assert (package / "LOCAL_NOTES.md").read_text() == "ours\n"
    assert "edited in place" not in (package / "__init__.py").read_text()
    assert "sql/retired.sql" not in (package / MARKER).read_text()


def test_force_writes_into_a_foreign_directory_and_deletes_nothing(tmp_path: Path) -> None:
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("# the application's own package\n")
    (package / "models.py").write_text("# not the export's\n")
    r = export_worker(tmp_path, "--name", "shop", "--force")
    assert r.returncode == 0, r.stderr
    assert "the application's own" not in (package / "__init__.py").read_text()
    assert (package / "models.py").read_text() == "# not the export's\n"
    assert (package / MARKER).is_file()
    # From now on it is an earlier export: a plain re-export works, and keeps models.py.
    assert export_worker(tmp_path, "--name", "shop").returncode == 0
    assert (package / "models.py").exists()


# --- the exported copy, alone, on a fresh database ---------------------------------------------

@pytest.fixture
def bare_db(admin_dsn: str) -> Iterator[str]:
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


@pytest.fixture
def enqueuer(admin_dsn: str, bare_db: str) -> Iterator[str]:
    """A login role for the application that enqueues; its DSN on the fresh database."""
    role, password = f"tenantlab_export_app_{os.getpid()}", "enqueues-only"
    with db.connect(admin_dsn, "test export", autocommit=True) as admin:
        admin.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("create role {} login password {}")
                      .format(sql.Identifier(role), sql.Literal(password)))
    try:
        yield make_conninfo(db.with_db(admin_dsn, bare_db), user=role, password=password)
    finally:
        # Its grants live in the fresh database: revoke them there, then drop the role.
        with db.connect(db.with_db(admin_dsn, bare_db), "test export", autocommit=True) as c:
            c.execute("select pg_terminate_backend(pid) from pg_stat_activity "
                      "where usename = %s", (role,))
            c.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
        with db.connect(admin_dsn, "test export", autocommit=True) as admin:
            admin.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


@pytest.mark.slow
@pytest.mark.parametrize("tenant_type", ["bigint", "uuid"])
def test_the_exported_worker_runs_jobs_alone(tmp_path: Path, admin_dsn: str, bare_db: str,
                                             enqueuer: str, tenant_type: str) -> None:
    out = tmp_path / "vendor"
    r = export_worker(out, "--name", "shop")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"PYTHONPATH={out.resolve()} python -m shop --dsn DSN"
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert {"shop/README.md", "shop/__init__.py", "shop/sql/queries.sql",
            "shop/migrations/0001_initial.sql"} <= files
    for p in out.rglob("*.py"):
        assert not re.search(r"^\s*(from|import)\s+tenantlab", p.read_text(), re.M), p
    readme = (out / "shop" / "README.md").read_text()
    assert "jobqueue migrate" in readme and "jobqueue reap" in readme
    (out / "shop_jobs.py").write_text(HANDLERS)

    owner = db.with_db(admin_dsn, bare_db)
    worker = make_conninfo(owner, user=db.WORKER, password=db.worker_password(admin_dsn))
    r = run_alone(out, "shop", "migrate", "--tenant-type", tenant_type, "--dsn", owner)
    assert r.returncode == 0, r.stderr
    assert "0001_initial" in r.stdout
    r = run_alone(out, "shop", "migrate", "--dsn", owner)
    assert (r.returncode, r.stdout.strip()) == (0, "up to date"), r.stderr
    app_role = conninfo_to_dict(enqueuer)["user"]
    with psycopg.connect(owner, autocommit=True) as c:
        c.execute("create table stamps (job bigint, tenant text, note text)")
        c.execute(sql.SQL("grant select, insert, update, delete on stamps to {}")
                  .format(sql.Identifier(db.WORKER)))
        # The README's grants, verbatim: nothing more is given to either role.
        for statement in readme_grants(readme, "app_worker"):
            c.execute(statement.replace(" to app_worker;", f' to "{db.WORKER}"'))
        for statement in readme_grants(readme, "app"):
            c.execute(statement.replace(" to app;", f' to "{app_role}"'))

    tenants = ([str(uuid.uuid4()) for _ in range(4)] if tenant_type == "uuid"
               else ["1", "2", "3", "4"])
    args = [json.dumps(tenants if tenant_type == "uuid" else [int(t) for t in tenants])]
    r = run_alone(out, "shop_jobs", enqueuer, *args, tenant_type)
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout)

    r = run_alone(out, "shop", "--dsn", worker, "--handlers", "shop_jobs", "--until-empty",
                  "--backoff", "0", "--name", "exported")
    assert r.returncode == 0, r.stderr
    with psycopg.connect(owner, autocommit=True) as c:
        jobs = c.execute("select id, status, attempts from jobqueue.jobs order by id").fetchall()
        stamps = c.execute("select job, tenant, note from stamps order by job").fetchall()
        runs = c.execute("select count(*) from jobqueue.job_runs where worker = 'exported'"
                         ).fetchone()[0]
        left = c.execute("select count(*) from pg_stat_activity where datname = %s "
                         "and pid <> pg_backend_pid()", (bare_db,)).fetchone()[0]
    assert [tuple(j) for j in jobs[:3]] == [(i, "done", 1) for i in ids[:3]]
    assert stamps == [(ids[i], tenants[i], f"n{i}") for i in range(3)]
    # A kind this worker has no handler for is not claimed: still queued, no attempt spent.
    assert tuple(jobs[3]) == (ids[3], "queued", 0)
    assert runs == 3
    assert left == 0  # the worker closed its sessions
