"""A PostgreSQL for the queue's own tests; one migrated template; a database per test.

The server: ``JOBQUEUE_TEST_DSN`` (a superuser's, or a role with CREATEDB and CREATEROLE), or a
throwaway cluster made with ``initdb``/``pg_ctl`` from PATH, or the whole suite is skipped with
one line saying so. The schema: ``jobqueue migrate`` on an empty database, once per session,
with the README's grants for the worker role; each test that needs a database gets a copy of
that template (``CREATE DATABASE ... TEMPLATE``: a file copy, not a migration per test).
Everything the session made (databases, roles, the throwaway cluster) is gone afterwards, and
no session of the queue may still be connected.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

DSN_ENV = "JOBQUEUE_TEST_DSN"
HERE = Path(__file__).resolve().parent
README = HERE.parent / "README.md"
PID = os.getpid()
PREFIX = f"jobqueue_test_{PID}_"
_counter = itertools.count(1)
ident = sql.Identifier


@dataclass
class Scratch:
    """A database of its own for one test: DSNs for the admin, the owner and the worker role."""

    name: str
    admin: str
    owner: str
    worker: str
    worker_role: str

    def connect(self, role: str = "worker", name: str | None = None,
                **kw: Any) -> psycopg.Connection:
        """Connect as 'worker' (an ordinary login role with the README's grants), or 'admin'."""
        dsn = {"worker": self.worker, "admin": self.admin, "owner": self.owner}[role]
        return psycopg.connect(dsn, application_name=f"jobqueue test {name or role}", **kw)


@dataclass
class Template:
    name: str
    owner: str
    owner_password: str
    worker: str
    worker_password: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def admin_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's admin DSN: JOBQUEUE_TEST_DSN, or a throwaway cluster, or skip."""
    if dsn := os.environ.get(DSN_ENV):
        yield dsn
        return
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip(f"no PostgreSQL for jobqueue's tests: set {DSN_ENV} to a superuser's DSN, "
                    "or put initdb and pg_ctl on PATH")
    # initdb refuses to run as root: then the cluster belongs to nobody, in a directory of its own.
    as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    home = Path(tempfile.mkdtemp(prefix="jobqueue-test-pg-"))
    if as_user:
        shutil.chown(home, "nobody")
    data, port, password = home / "data", _free_port(), secrets.token_hex(12)
    (home / "pw").write_text(password)
    if as_user:
        shutil.chown(home / "pw", "nobody")
    run: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 120}
    # Passwords checked (scram), as on a real server: a wrong one must be refused.
    made = subprocess.run([*as_user, initdb, "-D", str(data), "-U", "postgres",
                           f"--pwfile={home / 'pw'}", "-A", "scram-sha-256", "-E", "UTF8",
                           "--no-sync"], **run)
    if made.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        pytest.skip(f"initdb failed ({made.stderr.strip()[-200:]}): set {DSN_ENV} instead")
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off"
    started = subprocess.run([*as_user, pg_ctl, "-D", str(data), "-o", options, "-l",
                              str(home / "log"), "-w", "start"], **run)
    try:
        assert started.returncode == 0, started.stderr + (home / "log").read_text()
        yield f"host=127.0.0.1 port={port} user=postgres password={password} dbname=postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], **run)
        shutil.rmtree(home, ignore_errors=True)


def _admin(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, application_name="jobqueue test admin")


def readme_grants(role: str) -> list[str]:
    """The README's statements for the worker role (``app_worker``), as written, for `role`."""
    out = []
    for line in README.read_text().splitlines():
        stmt = line.split("--")[0].strip()
        if line.startswith("    ") and re.search(r"\bapp_worker\b", stmt) and stmt.endswith(";"):
            out.append(re.sub(r"\bapp_worker\b", role, stmt))
    assert out, "the README lists no grants for app_worker"
    return out


@pytest.fixture(scope="session")
def template(admin_dsn: str) -> Iterator[Template]:
    """An empty database migrated by ``jobqueue migrate`` as its owner; the README's grants."""
    t = Template(f"{PREFIX}template", f"jq_test_owner_{PID}", secrets.token_hex(12),
                 f"jq_test_worker_{PID}", secrets.token_hex(12))
    with _admin(admin_dsn) as admin:
        for role, password in ((t.owner, t.owner_password), (t.worker, t.worker_password)):
            admin.execute(sql.SQL("drop role if exists {}").format(ident(role)))
            admin.execute(sql.SQL("create role {} login password {}").format(
                ident(role), sql.Literal(password)))
        admin.execute(sql.SQL("create database {} owner {}").format(ident(t.name), ident(t.owner)))
    try:
        owner = make_conninfo(admin_dsn, dbname=t.name, user=t.owner, password=t.owner_password)
        done = subprocess.run([sys.executable, "-m", "jobqueue", "migrate", "--dsn", owner],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        grants = readme_grants(t.worker)
        # The grants as the owner; the role's settings (alter role) as the admin.
        with psycopg.connect(owner, autocommit=True) as conn, _admin(admin_dsn) as admin:
            for stmt in grants:
                (admin if stmt.startswith("alter role") else conn).execute(stmt.encode())
        yield t
    finally:
        with _admin(admin_dsn) as admin:
            # Nothing the tests started may still be connected (workers, heartbeats, listeners).
            left = admin.execute(
                "select datname, application_name, state from pg_stat_activity "
                "where datname like %s and pid <> pg_backend_pid()", (PREFIX + "%",)).fetchall()
            for name in _databases(admin):
                admin.execute(sql.SQL("drop database if exists {} with (force)").format(
                    ident(name)))
            for role in (t.worker, t.owner):
                admin.execute(sql.SQL("drop role if exists {}").format(ident(role)))
    assert not left, f"sessions left behind by jobqueue's tests: {left}"


def _databases(admin: psycopg.Connection) -> list[str]:
    return [r[0] for r in admin.execute(
        "select datname from pg_database where datname like %s", (PREFIX + "%",))]


@pytest.fixture
def scratch(admin_dsn: str, template: Template) -> Iterator[Scratch]:
    """A fresh copy of the migrated template, dropped after the test."""
    name = f"{PREFIX}{next(_counter)}"
    with _admin(admin_dsn) as admin:
        admin.execute(sql.SQL("create database {} template {} owner {}").format(
            ident(name), ident(template.name), ident(template.owner)))
    try:
        yield Scratch(
            name=name, admin=make_conninfo(admin_dsn, dbname=name),
            owner=make_conninfo(admin_dsn, dbname=name, user=template.owner,
                                password=template.owner_password),
            worker=make_conninfo(admin_dsn, dbname=name, user=template.worker,
                                 password=template.worker_password),
            worker_role=template.worker)
    finally:
        with _admin(admin_dsn) as admin:
            admin.execute(sql.SQL("drop database if exists {} with (force)").format(ident(name)))


@pytest.fixture
def fresh_db(admin_dsn: str) -> Iterator[dict[str, str]]:
    """An empty database (no migrations) owned by a throwaway owner role, and a throwaway worker
    role with no grants: what an application's own server looks like.

    Keys: ``admin`` (the admin's DSN on it), ``owner`` and ``worker_role`` (role names),
    ``worker`` (the worker role's DSN). Dropped afterwards, roles too.
    """
    n = next(_counter)
    name, owner, worker = f"{PREFIX}{n}", f"jq_owner_{PID}_{n}", f"jq_worker_{PID}_{n}"
    password = secrets.token_hex(12)

    def drop(admin: psycopg.Connection) -> None:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(ident(name)))
        for role in (worker, owner):
            admin.execute(sql.SQL("drop role if exists {}").format(ident(role)))

    with _admin(admin_dsn) as admin:
        drop(admin)
        admin.execute(sql.SQL("create role {} nologin").format(ident(owner)))
        admin.execute(sql.SQL("create role {} login password {}").format(
            ident(worker), sql.Literal(password)))
        admin.execute(sql.SQL("create database {} owner {}").format(ident(name), ident(owner)))
    try:
        yield {"admin": make_conninfo(admin_dsn, dbname=name), "owner": owner,
               "worker_role": worker,
               "worker": make_conninfo(admin_dsn, dbname=name, user=worker, password=password)}
    finally:
        with _admin(admin_dsn) as admin:
            drop(admin)
