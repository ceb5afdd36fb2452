"""The article's set-up, as facts of the template database; scratch databases are isolated."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest

from tenantlab import db, queries, schema
from tenantlab.server import Server, free_port


def check_schema(s: db.Scratch) -> None:
    with s.connect("admin") as conn:
        per_tenant = dict(conn.execute(queries.q("invoices_per_tenant")).fetchall())
        jobs_rls = conn.execute(
            "select relrowsecurity from pg_class where oid = 'jobs'::regclass").fetchone()[0]
    assert per_tenant == {t: 20000 // t for t in range(1, 101)}
    assert sum(per_tenant.values()) == 103_707
    assert jobs_rls is False, "jobs must not be under the tenant policy (finding rls-jobs)"

    policy = schema.policy(s)
    assert policy["enabled"] and policy["forced"] and policy["owner"] == db.OWNER
    assert policy["using_expr"].replace("\n", " ") == (
        "(tenant_id = (NULLIF(current_setting('app.tenant'::text, true), ''::text))::integer)")

    roles = schema.roles(s).set_index("role")
    worker = roles.loc[db.WORKER]
    assert worker.login and not worker.superuser and not worker.bypassrls
    assert not roles.loc[db.OWNER].login

    assert schema.count_as(s, 1) == 20000
    assert schema.count_as(s, 2) == 10000
    assert schema.count_as(s, 3) == 6666
    assert schema.count_as(s, None) == 0
    with s.connect("worker") as conn:
        user, owns = conn.execute(queries.q("whoami")).fetchone()
    assert user == db.WORKER and owns is False

    names = set(schema.constraints(s)["constraint"])
    assert {"attempts_within_budget", "running_has_lease", "status_is_known"} <= names


def test_schema_facts(scratch: db.Scratch) -> None:
    check_schema(scratch)


def test_constraints_guard_the_invariants(scratch: db.Scratch) -> None:
    with scratch.connect("worker") as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match="running_has_lease"):
            conn.execute("insert into jobs (tenant_id, status) values (1, 'running')")
        conn.rollback()
        with pytest.raises(psycopg.errors.CheckViolation, match="attempts_within_budget"):
            conn.execute("insert into jobs (tenant_id, attempts, max_attempts) values (1, 4, 3)")


def test_scratch_databases_are_isolated_and_dropped(admin_dsn: str) -> None:
    with db.scratch("a", admin_dsn) as a, db.scratch("b", admin_dsn) as b:
        assert a.name != b.name
        with a.connect("worker") as conn:
            conn.execute("insert into jobs (tenant_id) values (1), (2)")
        with a.connect("worker") as conn, b.connect("worker") as other:
            assert conn.execute("select count(*) from jobs").fetchone()[0] == 2
            assert other.execute("select count(*) from jobs").fetchone()[0] == 0
        # Interrupted work: a session left open does not stop the drop.
        lingering = b.connect("worker")
        lingering.execute("select 1")
    with psycopg.connect(admin_dsn) as conn:
        left = conn.execute("select count(*) from pg_database where datname = any(%s)",
                            ([a.name, b.name],)).fetchone()[0]
    assert left == 0
    lingering.close()


def test_schema_facts_as_notebook_00_shows_them(admin_dsn: str) -> None:
    lines = schema.check(schema.facts())
    assert lines and all(line.startswith("✓") for line in lines), lines


PG15 = Path("/usr/lib/postgresql/15/bin")


@pytest.mark.pg15
@pytest.mark.skipif(not (PG15 / "postgres").exists(), reason="Debian's PostgreSQL 15 is not here")
def test_the_schema_works_on_postgresql_15(monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path(tempfile.mkdtemp(prefix="tl15-", dir="/tmp"))
    home.chmod(0o755)
    monkeypatch.setenv("TENANTLAB_PG_BINDIR", str(PG15))
    port = free_port()
    server = Server(home)
    try:
        server.up(port=port)
        dsn = server.dsn()
        assert db.server_version(dsn).startswith("15.")
        with db.scratch("pg15", dsn) as s:
            check_schema(s)
    finally:
        server.down()
        shutil.rmtree(home, ignore_errors=True)
