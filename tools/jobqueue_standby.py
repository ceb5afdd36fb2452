"""Point the exported worker at a real hot standby and see what it does (issue 31).

Makes a hot standby of the kit's server (``pg_basebackup -R`` with the embedded PostgreSQL 17
binaries, on a free port), installs the product's schema in a database of its own on the primary
first, then runs ``python -m jobqueue --max-outage 3`` against the standby as the worker role and
prints its exit status, how long it ran (at most 20 s) and how many "reconnecting" lines it
logged. The standby, its files and the database are removed afterwards, also on Ctrl-C.

Usage: ``python tools/jobqueue_standby.py`` (the kit's server is started for the run if needed).
The jobqueue tests use ``default_transaction_read_only`` instead (tests/test_pooler.py): the same
refusal of every write, without copying the cluster.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tenantlab import db, server

ROOT = Path(__file__).resolve().parent.parent
NAME = f"jobqueue_standby_{os.getpid()}"


@dataclass
class Seen:
    """What the worker did against the standby."""

    status: int | None  # None: still running after 20 s (ended by the probe)
    seconds: float
    log: str

    @property
    def reconnecting(self) -> int:
        return self.log.count("reconnecting")


def main() -> int:
    with db.server_session() as admin:
        seen = probe(admin)
    status = "still running (ended)" if seen.status is None else f"exit {seen.status}"
    print(f"worker: {status} after {seen.seconds:.1f} s, {seen.reconnecting} 'reconnecting' "
          f"line(s)")
    print(seen.log.strip().splitlines()[0] if seen.log.strip() else "(nothing logged)")
    return 0


def probe(admin: str) -> Seen:
    """Run the worker against a hot standby of the server of `admin` (a superuser's DSN)."""
    bins = server.bindir()
    # As root the server's files belong to its own user; so must the standby's.
    owner = pwd.getpwuid((server.home() / "data").stat().st_uid).pw_name \
        if os.geteuid() == 0 else None
    as_user = ["runuser", "-u", owner, "--"] if owner else []
    home = Path(tempfile.mkdtemp(prefix="jobqueue-standby-"))
    if owner:
        shutil.chown(home, owner)
    target = conninfo_to_dict(admin)
    port = server.free_port()
    env = dict(os.environ, PGPASSWORD=str(target.get("password") or ""))
    db.ensure_template(admin)
    with db.connect(admin, "standby probe", autocommit=True) as conn:
        conn.execute(sql.SQL("create database {} template {} owner {}").format(
            sql.Identifier(NAME), sql.Identifier(db.TEMPLATE), sql.Identifier(db.OWNER)))
    try:
        db.install_product(db.with_db(admin, NAME))
        t = time.monotonic()
        subprocess.run([*as_user, str(bins / "pg_basebackup"), "-h", str(target["host"]),
                        "-p", str(target["port"]), "-U", str(target["user"]), "-D",
                        str(home / "data"), "-R", "-X", "stream", "-c", "fast"],
                       check=True, env=env, capture_output=True, timeout=300)
        subprocess.run([*as_user, str(bins / "pg_ctl"), "-D", str(home / "data"), "-l",
                        str(home / "log"), "-w", "-o",
                        f"-p {port} -c listen_addresses=127.0.0.1 -k {home}", "start"],
                       check=True, capture_output=True, timeout=120)
        print(f"standby up in {time.monotonic() - t:.1f} s on port {port}")
        dsn = make_conninfo(admin, host="127.0.0.1", port=str(port), dbname=NAME,
                            user=db.WORKER, password=db.worker_password(admin))
        with psycopg.connect(dsn) as conn:
            print("pg_is_in_recovery():", conn.execute("select pg_is_in_recovery()").fetchone())
        worker = [sys.executable, "-m", "jobqueue", "--dsn", dsn, "--handlers",
                  "noop_handlers", "--max-outage", "3"]
        child = dict(os.environ, PYTHONPATH=str(ROOT / "jobqueue" / "tests"))
        t = time.monotonic()
        try:
            done = subprocess.run(worker, capture_output=True, text=True, timeout=20,
                                  env=child)
            return Seen(done.returncode, time.monotonic() - t, done.stderr)
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            return Seen(None, time.monotonic() - t, err)
    finally:
        subprocess.run([*as_user, str(bins / "pg_ctl"), "-D", str(home / "data"), "-m",
                        "immediate", "-w", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(home, ignore_errors=True)
        with db.connect(admin, "standby probe", autocommit=True) as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(
                sql.Identifier(NAME)))


if __name__ == "__main__":
    raise SystemExit(main())
