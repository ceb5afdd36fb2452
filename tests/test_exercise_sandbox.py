"""Exercise answers are hostile input: a table of answers that try to escape, each asserting the
exact harm did not happen; the same escapes with the isolation removed do the harm (so these
tests see it); the catalog comparison names what an answer changed; answer files and strings
that cannot be checked say so in one line (exit 2), never "not yet"."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tenantlab import cli, db, exercises
from tenantlab.exercises import _core, _sandbox

#: A file an answer would make on the server's machine if it could run a program or write one.
MARK = f"/tmp/tenantlab-harm-{os.getpid()}-{uuid.uuid4().hex[:8]}"

#: What an escape would leave on the server, read as admin before and after a check. Only what
#: an answer would make (its roles, settings of the kit's or privileged roles, the server's own
#: databases): other test files run beside this one and make ordinary roles and databases.
_PRIVILEGED = ("rolname in ('tenantlab_owner', 'tenantlab_worker') or rolname like 'tl\\_evil%%' "
               "or rolsuper or rolcreaterole or rolcreatedb or rolbypassrls or rolreplication")
_OWN_DATABASES = "('postgres', 'template1', 'tenantlab_template', 'tenantlab_playground')"
FINGERPRINT = {
    "roles": "select rolname, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolcanlogin, "
             f"rolinherit from pg_roles where {_PRIVILEGED} order by 1",
    "memberships": "select roleid::regrole::text, member::regrole::text from pg_auth_members m "
                   f"join pg_roles r on r.oid = m.roleid or r.oid = m.member where {_PRIVILEGED} "
                   "order by 1, 2",
    "role and database settings": "select coalesce(r.rolname, '-'), coalesce(d.datname, '-'), "
                                  "setconfig::text from pg_db_role_setting s "
                                  "left join pg_roles r on r.oid = setrole "
                                  "left join pg_database d on d.oid = setdatabase "
                                  f"where (r.oid is null or {_PRIVILEGED}) and (d.oid is null "
                                  f"or d.datname in {_OWN_DATABASES}) order by 1, 2",
    "alter system": "select name, setting from pg_file_settings "
                    "where sourcefile like '%%postgresql.auto.conf' order by 1",
    "databases": "select datname, datacl::text, shobj_description(oid, 'pg_database') "
                 f"from pg_database where datname in {_OWN_DATABASES} "
                 "or datname like 'tl\\_evil%%' order by 1",
    "tablespaces": "select spcname from pg_tablespace order by 1",
    "prepared transactions": "select gid from pg_prepared_xacts",
    "advisory locks": "select pid from pg_locks where locktype = 'advisory' and objid = 8276551",
}


def fingerprint(dsn: str) -> dict[str, Any]:
    with db.connect(dsn, "test sandbox", autocommit=True) as conn:
        return {k: conn.execute(v).fetchall() for k, v in FINGERPRINT.items()}


@pytest.fixture(scope="module")
def victim_db(admin_dsn: str) -> Iterator[db.Scratch]:
    """Another database, where the worker role has a session: someone else's worker."""
    with db.scratch("victim", admin_dsn) as s:
        yield s


@pytest.fixture
def victims(admin_dsn: str, victim_db: db.Scratch) -> Iterator[dict[str, psycopg.Connection]]:
    """A worker-role session in another database, and an admin session: both must survive."""
    conns = {"the worker role's session in another database": victim_db.connect("worker", "victim"),
             "an admin session": db.connect(admin_dsn, "victim admin")}
    yield conns
    for c in conns.values():
        c.close()


def alive(conn: psycopg.Connection) -> bool:
    try:
        conn.execute("select 1")
        conn.rollback()
        return True
    except psycopg.OperationalError:
        return False


def _no_mark() -> None:
    if os.path.exists(MARK):  # made by the server's user: remove it, then fail the test
        os.remove(MARK)
        raise AssertionError(f"an answer made {MARK} on the server's machine")


# Every hostile answer: (class, exercise, answer). Each passes any word screen one might write
# (escaped identifiers, split strings, quotes that fool a statement splitter): what stops it is
# the rights of the role it logs in as.
HOSTILE = [
    # Escapes through quoting and transaction control (08 ran as the admin's `set local role`).
    ("quoting", "rls-jobs", 'create policy "p\'" on jobs using (true); commit; create role tl_evil_a'),
    ("quoting", "rls-jobs", "create policy p on jobs using (E'\\'' = ''); commit; reset role; "
                            "create role tl_evil_b"),
    ("quoting", "rls-jobs", "commit; set session authorization default; create role tl_evil_c"),
    ("quoting", "rls-jobs", "rollback; set role tenantlab_owner; alter role tenantlab_owner "
                            "set work_mem = '1MB'"),
    ("quoting", "rls-jobs", "end; select set_config('role', 'tenantlab_owner', false); "
                            "create role tl_evil_d"),
    ("quoting", "rls-jobs", "set local role postgres; create role tl_evil_e"),
    ("quoting", "leak", "commit; reset role; reset session authorization; create role tl_evil_f"),
    # Escaped identifiers and dynamic SQL.
    ("identifiers", "leak", 'select U&"pg\\005fterminate\\005fbackend"(pid) from pg_stat_activity '
                            "where pid <> pg_backend_pid()"),
    ("identifiers", "poison", "do $$ begin execute 'cre' || 'ate role tl_evil_g'; end $$"),
    ("identifiers", "poison", "do $$ begin execute format('alter database %%I set work_mem = "
                              "''1MB''', current_database()); end $$"),
    ("identifiers", "poison", 'alter role "tenantlab_worker" bypassrls'),
    # Cluster-wide objects.
    ("cluster", "poison", "alter system set work_mem = '1MB'"),
    ("cluster", "poison", "create tablespace tl_evil location '/tmp'"),
    ("cluster", "poison", "create database tl_evil"),
    ("cluster", "poison", "grant tenantlab_owner to current_user"),
    ("cluster", "poison", "alter role tenantlab_owner set work_mem = '1MB'"),
    ("cluster", "poison", "alter role current_user createrole"),
    ("cluster", "rls-jobs", "create extension file_fdw"),
    ("cluster", "rls-jobs", "alter table jobs owner to tenantlab_owner"),
    ("cluster", "rls-jobs", "alter table invoices disable row level security"),
    # Files and programs.
    ("files", "poison", f"copy (select 1) to program 'touch {MARK}'"),
    ("files", "poison", f"copy jobs to '{MARK}'"),
    ("files", "poison", f"copy jobs from program 'touch {MARK}'"),
    ("files", "poison", "select pg_read_file('/etc/passwd')"),
    ("files", "poison", "select pg_ls_dir('.')"),
    ("files", "poison", "select lo_import('/etc/passwd')"),
    ("files", "poison", f"select lo_export(lo_create(0), '{MARK}')"),
    ("files", "rls-jobs", "create extension file_fdw; create server s foreign data wrapper "
                          "file_fdw; create foreign table f (x text) server s options "
                          f"(program 'touch {MARK}'); select * from f"),
    # Other sessions: the victims (another database's worker-role session, an admin) survive.
    ("sessions", "poison", "select pg_terminate_backend(pid) from pg_stat_activity "
                           "where usename = 'tenantlab_worker'"),
    ("sessions", "poison", "select pg_cancel_backend(pid), pg_terminate_backend(pid) "
                           "from pg_stat_activity where pid <> pg_backend_pid()"),
    ("sessions", "rls-jobs", "drop policy tenant_isolation on jobs; create policy p on jobs "
                             "using ((select count(pg_terminate_backend(pid)) from "
                             "pg_stat_activity where pid <> pg_backend_pid()) >= 0)"),
    ("sessions", "rls-jobs", "create rule r as on update to jobs do also select "
                             "pg_terminate_backend(pid) from pg_stat_activity"),
    ("sessions", "noisy-neighbour", "select pg_terminate_backend(pid) from pg_stat_activity "
                                    "where usename = current_user and pid <> pg_backend_pid()"),
    # Resource exhaustion: locks, prepared transactions, temporary objects, time.
    ("resources", "leak", "select pg_advisory_lock(8276551); "
                          "select set_config('app.tenant', %(tenant)s, true)"),
    ("resources", "poison", "prepare transaction 'tl_evil'"),
    ("resources", "poison", "create temp table t as select generate_series(1, 1000000) g"),
    ("resources", "poison", "create table public.t (x int)"),
    ("resources", "leak", "lock table jobs in access exclusive mode; "
                          "select set_config('app.tenant', %(tenant)s, true)"),
    ("resources", "poison", "set statement_timeout = 0; select count(*) from "
                            "generate_series(1, 1e12::bigint)"),
]


#: The fixes some hostile answers carry along: with them, the answer is right.
FIXES = ("set_config('app.tenant', %(tenant)s, true)", "drop policy tenant_isolation on jobs")


@pytest.mark.parametrize("cls,ex_id,answer", HOSTILE,
                         ids=[f"{c}-{e}-{i}" for i, (c, e, _) in enumerate(HOSTILE)])
def test_a_hostile_answer_does_no_harm(admin_dsn: str, victims: dict[str, psycopg.Connection],
                                       monkeypatch: pytest.MonkeyPatch,
                                       cls: str, ex_id: str, answer: str) -> None:
    if cls == "resources":  # a loop is stopped by the timeouts: short ones here
        monkeypatch.setattr(_core, "OPTIONS", "-c statement_timeout=300 -c lock_timeout=300")
        monkeypatch.setattr(_core, "STATEMENT_TIMEOUT_MS", 300)
    made: list[str] = []
    create = _sandbox._create_role
    monkeypatch.setattr(_sandbox, "_create_role",
                        lambda admin, role, *rest: (made.append(role), create(admin, role, *rest)))
    before = fingerprint(admin_dsn)
    outcome = exercises.get(ex_id).check(answer)
    after = fingerprint(admin_dsn)
    # The harm: none of it, anywhere on the server.
    for key in FINGERPRINT:
        assert after[key] == before[key], f"{key} changed: {before[key]} -> {after[key]}"
    with db.connect(admin_dsn, "test sandbox", autocommit=True) as conn:  # its roles are gone
        assert made and not conn.execute("select rolname from pg_roles where rolname = any(%s)",
                                          (made,)).fetchall()
    _no_mark()
    for name, conn in victims.items():
        assert alive(conn), f"{name} was ended by the answer"
    assert not [b for b in db.leftover_backends(admin_dsn)
                if "exercise" in (b["application_name"] or "")]
    # And for the participant: one line, never a traceback; a hostile answer is not a fix.
    assert "\n" not in outcome.line()
    if not any(fix in answer for fix in FIXES):  # a right answer with harmless extras passes
        assert not outcome.correct, outcome.line()


def test_the_table_covers_every_class_with_thirty_answers() -> None:
    classes = {c for c, _, _ in HOSTILE}
    assert classes == {"quoting", "identifiers", "cluster", "files", "sessions", "resources"}
    assert len(HOSTILE) >= 30


#: Escapes that do harm when the answer runs on the admin connection: what each leaves behind.
UNISOLATED = [
    ("rls-jobs", 'create policy "p\'" on jobs using (true); commit; create role tl_evil_x',
     "roles"),
    ("poison", "alter role tenantlab_owner set work_mem = '1MB'", "role and database settings"),
    ("poison", f"copy (select 1) to program 'touch {MARK}'", "file"),
    ("poison", "select pg_terminate_backend(pid) from pg_stat_activity "
               "where usename = 'tenantlab_worker'", "session"),
]


@pytest.mark.parametrize("ex_id,answer,harm", UNISOLATED, ids=[u[2] for u in UNISOLATED])
def test_without_the_isolation_the_escapes_do_harm(
        admin_dsn: str, victims: dict[str, psycopg.Connection], monkeypatch: pytest.MonkeyPatch,
        ex_id: str, answer: str, harm: str) -> None:
    # What the checker was before: the answer on the admin's connection. The assertions of
    # test_a_hostile_answer_does_no_harm then fail: they see the harm.
    monkeypatch.setattr(_sandbox, "ISOLATE", False)
    before = fingerprint(admin_dsn)
    try:
        exercises.get(ex_id).check(answer)
        after = fingerprint(admin_dsn)
        if harm == "file":
            assert os.path.exists(MARK)
        elif harm == "session":
            assert not alive(victims["the worker role's session in another database"])
        else:
            assert after[harm] != before[harm]
    finally:
        with db.connect(admin_dsn, "test sandbox", autocommit=True) as conn:
            conn.execute("drop role if exists tl_evil_x")
            conn.execute("alter role tenantlab_owner reset all")
        if os.path.exists(MARK):
            os.remove(MARK)


def test_the_rules_name_what_an_answer_changed(admin_dsn: str) -> None:
    with _sandbox.sandbox("rules") as sb:
        rules = _core.Rules(sb)
        assert rules.changed() is None
        with sb.connect("admin", autocommit=True) as conn:
            conn.execute("grant update on invoices to tenantlab_worker")
        assert "grants on invoices" in (rules.changed() or "")
        rules = _core.Rules(sb)
        with sb.connect("worker", autocommit=True) as conn:
            conn.execute("alter role current_user set work_mem = '1MB'")
        assert "setting of role tenantlab_ex_" in (rules.changed() or "")


def test_a_check_role_holds_only_the_workers_grants(admin_dsn: str) -> None:
    with _sandbox.sandbox("grants", owner=True) as sb, sb.connect("admin") as conn:
        facts = conn.execute(
            "select rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolinherit, "
            "rolconnlimit, rolvaliduntil is not null, "
            "(select count(*) from pg_auth_members m where m.member = r.oid) "
            "from pg_roles r where rolname = %s", (sb.worker_role,)).fetchone()
        assert facts == (False, False, False, False, False, _sandbox.CONNECTION_LIMIT, True, 0)
        mine = set(conn.execute("select table_name, privilege_type from "
                                "information_schema.role_table_grants where grantee = %s",
                                (sb.worker_role,)).fetchall())
        workers = set(conn.execute("select table_name, privilege_type from "
                                   "information_schema.role_table_grants where grantee = %s",
                                   (db.WORKER,)).fetchall())
        assert mine == workers and ("jobs", "UPDATE") in mine
        owner = conn.execute("select tableowner from pg_tables where tablename = 'jobs'").fetchone()
        assert owner == (sb.owner_role,)
        assert conn.execute("select has_database_privilege(%s, current_database(), 'TEMP, CREATE')",
                            (sb.worker_role,)).fetchone() == (False,)


# --- answers that cannot be checked: one line, exit 2 -----------------------------------------

@pytest.mark.parametrize("data,says", [
    (b"\xef\xbb\xbfselect set_config('app.tenant', %(tenant)s, true)\n", None),  # BOM: fine
    (b"select 1\x00; drop table jobs", "holds a NUL byte"),
    ("select 'café'".encode("latin-1"), "not UTF-8 (byte 0xe9 at position 12)"),
    (b"select 1 as x", "returned columns x"),
    (b"-- " + b"x" * 1_000_001, "more than 1 MB"),
])
def test_an_answer_file_is_checked_or_refused_in_one_line(
        admin_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        data: bytes, says: str | None) -> None:
    path = tmp_path / "answer.sql"
    path.write_bytes(data)
    ex_id = "poison" if b"as x" in data else "leak"
    status = cli.main(["exercises", "check", ex_id, "--answer", str(path)])
    out, err = capsys.readouterr()
    if says is None:
        assert status == 0 and out.startswith("✓"), out + err
        return
    assert status == 2, out + err
    assert says in out + err and "not yet" not in out + err
    assert (out + err).count("\n") == 1 and "Traceback" not in err


def test_an_unreadable_answer_file_exits_2(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["exercises", "check", "leak", "--answer", str(tmp_path / "none.sql")]) == 2
    assert "could not check: cannot read the answer" in capsys.readouterr().err
    assert cli.main(["exercises", "check", "leak", "--answer", str(tmp_path)]) == 2
    assert "could not check" in capsys.readouterr().err


def test_answer_on_a_terminal_says_it_reads_standard_input(
        admin_dsn: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    class Tty:
        buffer = type("B", (), {"read": staticmethod(lambda n: b"set local app.tenant = "
                                                                b"%(tenant)s")})()

        @staticmethod
        def isatty() -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty())
    assert cli.main(["exercises", "check", "leak", "--answer", "-"]) == 0
    assert "reading your answer from standard input" in capsys.readouterr().err


@pytest.mark.parametrize("answer,says", [
    (42, "not text"),
    (["select 1"], "not text"),
    ("select 1\x00", "NUL byte"),
])
def test_an_answer_that_is_not_text_cannot_be_checked(answer: Any, says: str) -> None:
    outcome = exercises.get("leak").check(answer)
    assert not outcome.checked and outcome.line().startswith("could not check: ")
    assert says in outcome.line() or "holds a NUL" in outcome.line()
    assert json.loads(json.dumps(outcome.to_json()))["checked"] is False


def test_the_first_hint_reads_the_participants_own_run(admin_dsn: str) -> None:
    ex = exercises.get("poison")
    ex._hints_shown, ex._last = 0, None
    assert ex.hint().body.startswith("You have not checked an answer yet")
    ex._hints_shown = 0
    ex.check(ex.answer.replace("attempts = attempts + 1", "attempts = max_attempts"))
    first = ex.hint().body
    assert first.startswith("Your last check, each claim: running, counted once, leased")
    assert "moved job 1's attempts from 0 to 3" in first
    ex._hints_shown, ex._last = 0, None


@pytest.mark.parametrize("ex_id,answer,says", [
    ("poison", "select 999 as id, 1 as attempt", "returned id 999, which is no job"),
    ("poison", "select 'abc' as id, 1 as attempt", "two numbers"),
    ("overrun", "select 'yes' as finished", "returned finished = 'yes'"),
])
def test_an_answer_of_the_wrong_shape_cannot_be_checked(admin_dsn: str, ex_id: str, answer: str,
                                                        says: str) -> None:
    outcome = exercises.get(ex_id).check(answer)
    assert not outcome.checked and outcome.line().startswith("could not check: ")
    assert says in outcome.line() and "\n" not in outcome.line()


def test_clean_scratch_removes_what_a_killed_process_left(
        admin_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    dead = 4_000_000  # above any pid_max: no process has it
    name = f"tenantlab_ex_leak_{dead}_1"
    role = "tenantlab_ex_00deadbeef_w"
    with db.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
        conn.execute(f"create role {role} valid until '2000-01-01'")
    with db.scratch("alive", admin_dsn) as mine:  # this process's own: in use, kept
        assert cli.main(["clean-scratch"]) == 1
        listed = capsys.readouterr().out
        assert f"database {name}" in listed and f"role {role}" in listed
        assert mine.name not in listed
        assert cli.main(["clean-scratch", "--yes"]) == 0
        assert f"removed database {name}" in capsys.readouterr().out
        assert mine.name in db.scratch_databases(admin_dsn)
    assert name not in db.scratch_databases(admin_dsn)
    assert cli.main(["clean-scratch"]) == 0
    assert "no leftover" in capsys.readouterr().out


def test_solutions_and_progress_settings_say_what_they_accept(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tenantlab import settings
    from tenantlab.errors import ConfigurationError

    for value, shown in (("on", True), ("yes", True), ("1", True), ("off", False), ("0", False)):
        monkeypatch.setenv("TENANTLAB_SOLUTIONS", value)
        assert settings.solutions() is shown
    monkeypatch.setenv("TENANTLAB_SOLUTIONS", "maybe")
    with pytest.raises(ConfigurationError, match="must be 1 or 0"):
        settings.solutions()
    monkeypatch.setenv("TENANTLAB_EXERCISES", "progress.json")
    with pytest.raises(ConfigurationError, match="relative path"):
        settings.exercises_file()
    monkeypatch.setenv("TENANTLAB_EXERCISES", str(tmp_path / "p.json"))
    assert settings.exercises_file() == tmp_path / "p.json"


def test_a_session_left_on_the_template_is_named_not_read_as_a_password(
        admin_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    answer = tmp_path / "a.sql"
    answer.write_text("set local app.tenant = %(tenant)s")
    with psycopg.connect(db.with_db(admin_dsn, db.TEMPLATE)):  # a psql left connected
        assert cli.main(["exercises", "check", "leak", "--answer", str(answer)]) == 2
    err = capsys.readouterr().err
    assert "is being accessed by other users" in err and "a psql or a GUI" in err
    assert "password" not in err and err.count("\n") == 2
