"""The kit on a managed-PostgreSQL-like admin role (CREATEROLE, CREATEDB, pg_monitor; no
superuser) on PostgreSQL 17 and 15, its one-line errors, and `uninstall` leaving nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tenantlab.server import Server, free_port

PG15 = Path("/usr/lib/postgresql/15/bin")
PASSWORD = "managed-pw"


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "TENANTLAB_DATABASE_URL", "TENANTLAB_PG_BINDIR")}
    return env | {"TENANTLAB_HOME": str(home)} | extra


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tenantlab", *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.fixture(scope="module", params=[
    pytest.param(None, id="pg17"),
    pytest.param(PG15, id="pg15", marks=[
        pytest.mark.pg15,
        pytest.mark.skipif(not (PG15 / "postgres").exists(), reason="Debian's PostgreSQL 15 is not here")]),
])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[Server, str]]:
    """A server of its own (the kit's roles must not exist yet), with its superuser DSN."""
    home = Path(tempfile.mkdtemp(prefix="tl-managed-", dir="/tmp"))
    home.chmod(0o755)
    saved = os.environ.get("TENANTLAB_PG_BINDIR")
    if request.param is not None:
        os.environ["TENANTLAB_PG_BINDIR"] = str(request.param)
    server = Server(home)
    try:
        server.up(port=free_port())
        yield server, server.dsn()
    finally:
        server.down()
        if saved is None:
            os.environ.pop("TENANTLAB_PG_BINDIR", None)
        else:
            os.environ["TENANTLAB_PG_BINDIR"] = saved
        shutil.rmtree(home, ignore_errors=True)


def _role(superuser_dsn: str, name: str, attributes: str) -> str:
    with psycopg.connect(superuser_dsn, autocommit=True) as conn:
        conn.execute(f"drop role if exists {name}")
        conn.execute(f"create role {name} login password '{PASSWORD}' {attributes}")
    return make_conninfo(superuser_dsn, user=name, password=PASSWORD)


def _left(superuser_dsn: str) -> tuple[list[str], list[str]]:
    with psycopg.connect(superuser_dsn, autocommit=True) as conn:
        dbs = [r[0] for r in conn.execute(
            "select datname from pg_database where datname like 'tenantlab%' order by 1")]
        roles = [r[0] for r in conn.execute(
            "select rolname from pg_roles where rolname like 'tenantlab%' order by 1")]
    return dbs, roles


def test_findings_run_as_a_managed_role_and_uninstall_leaves_nothing(
        server: tuple[Server, str]) -> None:
    srv, su = server
    managed = _role(su, "managed_admin", "createrole createdb in role pg_monitor")
    env = _env(srv.home)
    out = srv.home / "reproduce.json"
    done = cli("--database-url", managed, "reproduce", "leak", "poison", "rls-jobs",
               "--json", str(out), env=env)
    assert done.returncode == 0, done.stderr
    findings = json.loads(out.read_text())["findings"]
    assert {k: v["reproduced"] for k, v in findings.items()} == \
        {"leak": True, "poison": True, "rls-jobs": True}
    # The exercises' sandbox as a managed admin: the check's roles made, used and dropped.
    for ex_id in ("poison", "rls-jobs"):
        answer = srv.home / f"{ex_id}.sql"
        answer.write_text(cli("exercises", "solution", ex_id, env=env).stdout)
        checked = cli("--database-url", managed, "exercises", "check", ex_id, "--answer",
                      str(answer), env=env)
        assert checked.returncode == 0 and checked.stdout.startswith("✓"), checked.stderr
    assert not [r for r in _left(su)[1] if r.startswith("tenantlab_ex_")]
    with psycopg.connect(su) as conn:
        attrs = conn.execute("select rolsuper, rolbypassrls, rolcanlogin, rolinherit from pg_roles "
                             "where rolname = 'tenantlab_worker'").fetchone()
        assert attrs == (False, False, True, False)
        assert conn.execute("select rolsuper from pg_roles where rolname = 'managed_admin'"
                            ).fetchone() == (False,)

    # Without --yes: a list, nothing removed.
    listed = cli("--database-url", managed, "uninstall", env=env)
    assert listed.returncode == 1 and "database tenantlab_template" in listed.stdout
    assert _left(su)[1] == ["tenantlab_owner", "tenantlab_worker"]
    removed = cli("--database-url", managed, "uninstall", "--yes", env=env)
    assert removed.returncode == 0, removed.stderr
    assert "removed database tenantlab_template" in removed.stdout
    assert "removed role tenantlab_worker" in removed.stdout
    assert _left(su) == ([], [])
    again = cli("--database-url", managed, "uninstall", "--yes", env=env)
    assert again.returncode == 0 and "nothing of tenantlab's" in again.stdout
    with psycopg.connect(su, autocommit=True) as conn:
        conn.execute("drop role managed_admin")


def _one_or_two_lines(done: subprocess.CompletedProcess[str], status: int = 1) -> str:
    assert done.returncode == status, (done.stdout, done.stderr)
    # Progress lines ("leak: running ...") may come first; the failure is the rest.
    lines = done.stderr.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("tenantlab "))
    assert len(lines) - start <= 2 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_a_missing_privilege_is_one_or_two_lines(server: tuple[Server, str]) -> None:
    srv, su = server
    plain = _role(su, "plain_user", "")
    try:
        err = _one_or_two_lines(cli("--database-url", plain, "reproduce", "leak", env=_env(srv.home)))
        assert "lacks CREATEROLE and CREATEDB" in err
        # --debug shows the traceback.
        debug = cli("--debug", "--database-url", plain, "reproduce", "leak", env=_env(srv.home))
        assert debug.returncode == 1 and "Traceback" in debug.stderr
    finally:
        with psycopg.connect(su, autocommit=True) as conn:
            conn.execute("drop role plain_user")
        assert _left(su) == ([], [])


def test_a_wrong_password_is_one_or_two_lines(server: tuple[Server, str]) -> None:
    srv, su = server
    wrong = make_conninfo(su, password="not-the-password")
    err = _one_or_two_lines(cli("reproduce", "leak", env=_env(
        srv.home, TENANTLAB_DATABASE_URL=wrong)), status=2)  # configuration, not an outage
    assert "password authentication failed" in err and "TENANTLAB_DATABASE_URL" in err


def test_a_server_that_is_down_is_one_or_two_lines(tmp_path: Path) -> None:
    down = f"postgresql://postgres:x@127.0.0.1:{free_port()}/postgres"
    err = _one_or_two_lines(cli("status", env=_env(tmp_path, TENANTLAB_DATABASE_URL=down)))
    assert "cannot connect to PostgreSQL" in err
    # The embedded server, not started: says how to start it.
    err = _one_or_two_lines(cli("reproduce", "leak", env=_env(tmp_path)))
    assert "`tenantlab up`" in err


def test_a_bare_database_url_is_used_only_when_told(tmp_path: Path) -> None:
    down = f"postgresql://postgres:x@127.0.0.1:{free_port()}/postgres"
    env = _env(tmp_path, DATABASE_URL=down)
    ignored = cli("status", env=env)
    assert ignored.returncode == 1 and "DATABASE_URL is set but not used" in ignored.stderr
    used = cli("status", env=env | {"TENANTLAB_USE_DATABASE_URL": "1"})
    assert "cannot connect to PostgreSQL" in _one_or_two_lines(used)


def test_roles_made_by_another_admin_are_named_in_one_line(server: tuple[Server, str]) -> None:
    from tenantlab import db

    srv, su = server
    db.ensure_template(su)  # a superuser set the kit up first
    managed = _role(su, "late_admin", "createrole createdb in role pg_monitor")
    try:
        with psycopg.connect(su) as conn:
            major = int(conn.execute("show server_version_num").fetchone()[0]) // 10000
        done = cli("--database-url", managed, "reproduce", "leak", env=_env(srv.home))
        if major >= 16:  # only 16+ limits CREATEROLE to the roles one administers
            assert "set up on this server by another admin" in _one_or_two_lines(done)
        else:
            assert done.returncode == 0, done.stderr
    finally:
        db.uninstall(su)
        with psycopg.connect(su, autocommit=True) as conn:
            conn.execute("drop role late_admin")
    assert _left(su) == ([], [])
