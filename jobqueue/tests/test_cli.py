"""`python -m jobqueue`: a bad configuration is one line on stderr and exit 2, at once.

Each case runs the command line as a subprocess with a timeout: a command that retries a wrong
password or a missing database as if it were an outage would run for ever, so "still running"
is a failure here, not a hang. Only a server that was reachable and went away is an outage.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest
from conftest import Scratch
from psycopg.conninfo import make_conninfo

from jobqueue import enqueue

PROG = [sys.executable, "-m", "jobqueue"]
EXIT_CONFIG = 2
WAIT = 30.0  # far longer than a refusal takes; a command still running then retries for ever

# Handler modules, importable from the child's working directory.
MODULES = {
    "good_handlers": """
        from jobqueue import Handlers
        handlers = Handlers({"noop": lambda conn, job: None})
    """,
    "empty_handlers": """
        handlers = {}
    """,
    "syntax_handlers": """
        def broken(:
            pass
    """,
    "raising_handlers": """
        raise RuntimeError("the settings module is not configured")
    """,
    "slow_handlers": """
        import time
        from jobqueue import Handlers
        handlers = Handlers({"slow": lambda conn, job: time.sleep(120)})
    """,
}

COMMAND_ARGS = {
    "worker": ["worker", "--handlers", "good_handlers"],
    "reap": ["reap"],
    "prune": ["prune", "--older-than", "60"],
    "migrate": ["migrate"],
}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    return tmp_path


def child_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBQUEUE_", "PG"))}
    env["PYTHONPATH"] = os.pathsep.join([str(home), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run(home: Path, *args: str, dsn: str | None = None,
        timeout: float = WAIT) -> subprocess.CompletedProcess:
    """Run the command line in `home`; fail (not hang) if it is still running after `timeout`."""
    argv = [*PROG, *args] + (["--dsn", dsn] if dsn is not None else [])
    try:
        return subprocess.run(argv, cwd=home, env=child_env(home), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"{' '.join(args)}: still running after {timeout:g} s (retrying a "
                    f"configuration error as an outage?); stderr: {err.strip()[-300:]}")


def refused(r: subprocess.CompletedProcess, *words: str) -> str:
    """Assert exit 2 with one line on stderr, no traceback, naming `words`; return the line."""
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == EXIT_CONFIG, f"exit {r.returncode}: {r.stderr.strip()[-500:]}"
    assert len(lines) == 1, r.stderr
    for word in words:
        assert word.lower() in lines[0].lower(), lines[0]
    return lines[0]


def free_port() -> int:
    """Return a local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the connection: DSN, login, database, server --------------------------------------------

@pytest.mark.parametrize("command", list(COMMAND_ARGS))
def test_a_malformed_dsn_is_a_configuration_error(home: Path, command: str) -> None:
    refused(run(home, *COMMAND_ARGS[command], dsn="host=localhost port"), "DSN")


@pytest.mark.parametrize("command", list(COMMAND_ARGS))
def test_a_wrong_password_is_a_configuration_error(home: Path, scratch: Scratch,
                                                   command: str) -> None:
    dsn = make_conninfo(scratch.worker, password="certainly-not-the-password")
    refused(run(home, *COMMAND_ARGS[command], dsn=dsn), "log in", "password")


@pytest.mark.parametrize("command", list(COMMAND_ARGS))
def test_a_missing_database_is_a_configuration_error(home: Path, admin_dsn: str,
                                                     command: str) -> None:
    dsn = make_conninfo(admin_dsn, dbname=f"jobqueue_no_such_db_{os.getpid()}")
    refused(run(home, *COMMAND_ARGS[command], dsn=dsn), "database", "does not exist")


# A worker waits for a server not reachable at start, as for any outage (up to --max-outage,
# then exit 3): tests/test_core.py and tests/test_pooler.py. The one-shot commands do not wait.
@pytest.mark.parametrize("command", [c for c in COMMAND_ARGS if c != "worker"])
def test_a_server_never_reached_is_a_configuration_error_not_an_outage(
        home: Path, admin_dsn: str, command: str) -> None:
    dsn = make_conninfo(admin_dsn, host="127.0.0.1", port=str(free_port()))
    refused(run(home, *COMMAND_ARGS[command], dsn=dsn), "reach", "host and port")


def test_an_unknown_host_is_a_configuration_error(home: Path, admin_dsn: str) -> None:
    dsn = make_conninfo(admin_dsn, host="no-such-host.invalid")
    refused(run(home, *COMMAND_ARGS["worker"], dsn=dsn), "reach", "no-such-host.invalid")


# --- the database: schema and grants ------------------------------------------------------------

@pytest.mark.parametrize("command", ["worker", "reap", "prune"])
def test_a_database_without_the_migrations_is_a_configuration_error(
        home: Path, fresh_db: dict[str, str], command: str) -> None:
    refused(run(home, *COMMAND_ARGS[command], dsn=fresh_db["worker"]), "migrate")


@pytest.mark.parametrize("command", ["worker", "reap", "prune"])
def test_a_role_without_grants_is_a_configuration_error(
        home: Path, scratch: Scratch, fresh_db: dict[str, str], command: str) -> None:
    # fresh_db's worker role has no grants anywhere: here, in a migrated database.
    dsn = make_conninfo(fresh_db["worker"], dbname=scratch.name)
    refused(run(home, *COMMAND_ARGS[command], dsn=dsn), fresh_db["worker_role"])


def test_migrate_as_a_role_that_may_not_create_the_schema_is_a_configuration_error(
        home: Path, fresh_db: dict[str, str]) -> None:
    refused(run(home, "migrate", dsn=fresh_db["worker"]), fresh_db["worker_role"], "owner")


# --- the handlers -------------------------------------------------------------------------------

@pytest.mark.parametrize(("module", "words"), [
    ("syntax_handlers", ["syntax_handlers", "SyntaxError"]),
    ("raising_handlers", ["raising_handlers", "RuntimeError", "not configured"]),
    ("no_such_handlers", ["no_such_handlers", "No module named"]),
])
def test_a_handlers_module_that_fails_to_import_is_a_configuration_error(
        home: Path, scratch: Scratch, module: str, words: list[str]) -> None:
    refused(run(home, "worker", "--handlers", module, dsn=scratch.worker), *words)


@pytest.mark.parametrize("handlers", [None, "empty_handlers"])
def test_a_worker_without_handlers_refuses_to_start(home: Path, scratch: Scratch,
                                                    handlers: str | None) -> None:
    args = ["worker"] + (["--handlers", handlers] if handlers else [])
    refused(run(home, *args, dsn=scratch.worker), "no handlers")


def test_debug_shows_the_traceback(home: Path, scratch: Scratch) -> None:
    r = run(home, "--debug", "worker", "--handlers", "syntax_handlers", dsn=scratch.worker)
    assert r.returncode != 0 and "Traceback" in r.stderr and "SyntaxError" in r.stderr


# --- what works, and what is an outage ----------------------------------------------------------

def start_worker(home: Path, dsn: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*PROG, "worker", *args, "--dsn", dsn], cwd=home,
                            env=child_env(home), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def wait_for(what: str, check, proc: subprocess.Popen, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"exited {proc.returncode} before {what}: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.1)


def finish(proc: subprocess.Popen, timeout: float = WAIT) -> tuple[int, str]:
    """Wait for the process's exit; kill it (and fail) if it does not come."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"still running after {timeout:g} s")
    return proc.returncode, err


def test_a_second_sigterm_stops_a_worker_at_once(home: Path, scratch: Scratch) -> None:
    with scratch.connect("worker", "test cli", autocommit=True) as conn:
        job = enqueue(conn, "slow", tenant=1)
        proc = start_worker(home, scratch.worker, "--handlers", "slow_handlers", "--lease", "300")
        try:
            wait_for("the job running", lambda: conn.execute(
                "select status from jobqueue.jobs where id = %s", (job,)).fetchone()[0]
                == "running", proc)
            proc.send_signal(signal.SIGTERM)  # the first waits for the job (120 s)...
            time.sleep(0.5)
            assert proc.poll() is None, proc.stderr.read()
            proc.send_signal(signal.SIGTERM)  # ...the second does not
            code, err = finish(proc, timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        row = conn.execute("select status, attempts from jobqueue.jobs where id = %s",
                           (job,)).fetchone()
    assert code == 130, err
    assert "Traceback" not in err
    assert row == ("running", 1)  # rolled back, still leased: retried, counted, once it expires


def test_a_worker_with_a_good_configuration_starts(home: Path, scratch: Scratch) -> None:
    r = run(home, *COMMAND_ARGS["worker"], "--until-empty", dsn=scratch.worker)
    assert r.returncode == 0, r.stderr
    for command in ("reap", "prune"):
        r = run(home, *COMMAND_ARGS[command], dsn=scratch.worker)
        assert r.returncode == 0, r.stderr


def test_migrate_applies_then_is_up_to_date_and_schema_is_its_alias(
        home: Path, fresh_db: dict[str, str]) -> None:
    owner = fresh_db["admin"]
    first = run(home, "migrate", "--tenant-type", "uuid", dsn=owner)
    assert first.returncode == 0, first.stderr
    assert "0001" in first.stdout, first.stdout
    again = run(home, "schema", dsn=owner)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == "up to date"
    with psycopg.connect(owner) as conn:
        base = conn.execute("select format_type(typbasetype, null) from pg_type t "
                            "join pg_namespace n on n.oid = typnamespace "
                            "where nspname = 'jobqueue' and typname = 'tenant_id'").fetchone()
    assert base == ("uuid",)


def test_the_help_says_what_a_second_sigterm_does(home: Path) -> None:
    r = run(home, "worker", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "after its current job" in text and "a second one stops it at once" in text
    assert "2 bad configuration" in text
