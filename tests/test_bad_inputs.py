"""Bad input, one or two lines, every time: a table of bad flags, variables and servers.

Each row runs an entry point (``python -m tenantlab`` or ``python -m jobqueue``) as
a subprocess, and must end with a non-zero status, no traceback, at most two lines on stderr,
and before a timeout (a worker that reconnects for ever, or a command that does the work
before it checks its output path, fails here). The rows that need no server run without one;
the wrong-password and missing-database rows use the session's server. Both tables run four
at a time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from jobqueue import preflight
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parent.parent
TL, JQ = ["-m", "tenantlab"], ["-m", "jobqueue"]
#: Long enough for a loaded 2-core machine to import the kit; far shorter than "for ever".
TIMEOUT = 45
NOWHERE = "/nonexistent-tenantlab-dir"
GOOD_DSN = "postgresql://nobody@127.0.0.1:1/nothing"  # parses; never connected to here

# (category, argv, environment). {file} is a regular file, {dir} a directory.
OFFLINE: list[tuple[str, list[str], dict[str, str]]] = [
    # Not a DSN or URL, by flag and by variable.
    ("dsn", TL + ["--database-url", "notadsn", "status"], {}),
    ("dsn", TL + ["--database-url", "http://x", "status"], {}),
    ("dsn", TL + ["status"], {"TENANTLAB_DATABASE_URL": "notadsn"}),
    ("dsn", TL + ["status"], {"DATABASE_URL": "http://x", "TENANTLAB_USE_DATABASE_URL": "1"}),
    ("dsn", TL + ["enqueue", "--kind", "sleep"], {"TENANTLAB_DSN": "notadsn"}),
    ("dsn", TL + ["enqueue", "--kind", "sleep", "--dsn", "http://x"], {}),
    ("dsn", TL + ["worker", "--dsn", "notadsn"], {}),
    ("dsn", TL + ["status"], {"TENANTLAB_PGBOUNCER_URL": "notadsn"}),
    ("dsn", JQ + ["--dsn", "notadsn"], {}),
    ("dsn", JQ + ["reap"], {"JOBQUEUE_DSN": "http://x"}),
    ("dsn", JQ + ["prune", "--older-than", "1"], {}),  # no DSN at all
    # Non-finite, out-of-range or malformed numbers.
    ("number", TL + ["worker", "--lease", "nan"], {}),
    ("number", TL + ["worker", "--lease", "inf"], {}),
    ("number", TL + ["worker", "--heartbeat", "inf"], {}),
    ("number", TL + ["reap", "--grace", "1e300"], {}),
    ("number", TL + ["enqueue", "--kind", "sleep", "--seconds", "nan"], {}),
    ("number", TL + ["enqueue", "--kind", "sleep", "--seconds", "inf"], {}),
    ("number", TL + ["enqueue", "--kind", "sleep", "--count", "1000000000"], {}),
    ("number", TL + ["enqueue", "--kind", "sleep", "--max-attempts", "2147483648"], {}),
    ("number", TL + ["enqueue", "--kind", "sleep", "--tenant", "0"], {}),
    ("number", TL + ["bench", "--workers", "100000"], {}),
    ("number", TL + ["bench", "--noisy", "20000"], {}),
    ("number", TL + ["up", "--port", "80"], {}),
    ("number", JQ + ["--dsn", GOOD_DSN, "--lease", "inf"], {}),
    ("number", JQ + ["--dsn", GOOD_DSN, "--poll", "nan"], {}),
    ("number", JQ + ["prune", "--dsn", GOOD_DSN, "--older-than", "inf"], {}),
    ("number", JQ + ["prune", "--dsn", GOOD_DSN, "--older-than", "1", "--batch", "1.5"], {}),
    ("number", JQ + ["reap", "--dsn", GOOD_DSN, "--grace", "nan"], {}),
    # Other flags: choices, names, addresses.
    ("flag", TL + ["nosuchcommand"], {}),
    ("flag", TL + ["reproduce", "nosuchfinding"], {}),
    ("flag", TL + ["lab", "--ip", "999.1.1.1", "--no-browser"], {}),
    ("flag", JQ + ["--dsn", GOOD_DSN, "--fair", "sometimes"], {}),
    ("flag", JQ + ["--dsn", GOOD_DSN, "--handlers", "no_such_module_here"], {}),
    ("flag", JQ + ["migrate", "--dsn", GOOD_DSN, "--tenant-type", "float"], {}),
    # Paths: outputs checked before a run, a directory that is a file.
    ("path", TL + ["reproduce", "vacuum", "--json", f"{NOWHERE}/r.json"], {}),
    ("path", TL + ["reproduce", "vacuum", "--report", f"{NOWHERE}/r.html"], {}),
    ("path", TL + ["reproduce", "vacuum", "--json", "{dir}"], {}),
    ("path", TL + ["worker", "--events", f"{NOWHERE}/e.jsonl"], {}),
    ("path", TL + ["export-worker", "{file}"], {}),
    ("path", TL + ["export-worker", "{dir}", "--name", "1-not-an-identifier"], {}),
    # Environment variables.
    ("env", TL + ["status"], {"TENANTLAB_HOME": "{file}"}),
    ("env", TL + ["up"], {"TENANTLAB_HOME": "{file}"}),
    ("env", TL + ["status"], {"TENANTLAB_SQL": NOWHERE}),
    ("env", TL + ["status"], {"TENANTLAB_SIZE": "Full"}),
    ("env", TL + ["status"], {"TENANTLAB_PORT": "eighty"}),
    ("env", TL + ["up"], {"TENANTLAB_PG_BINDIR": NOWHERE}),
    ("env", TL + ["lab", "--no-browser"], {"TENANTLAB_NOTEBOOKS": NOWHERE}),
    ("env", TL + ["status"], {"TENANTLAB_OUTSIDE_HANG": "inf"}),
    ("env", TL + ["status"], {"TENANTLAB_USE_DATABASE_URL": "maybe"}),
    ("env", TL + ["status"], {"TENANTLAB_SOLUTIONS": "sometimes"}),
    ("env", TL + ["exercises", "list"], {"TENANTLAB_EXERCISES": "progress.json"}),
    ("env", TL + ["exercises", "list"], {"TENANTLAB_EXERCISES": "{dir}"}),
    # Answer files that cannot be checked: one line, exit 2, before any server is needed.
    ("answer", TL + ["exercises", "check", "leak", "--answer", f"{NOWHERE}/a.sql"], {}),
    ("answer", TL + ["exercises", "check", "leak", "--answer", "{dir}"], {}),
    ("answer", TL + ["exercises", "check", "nosuch", "--answer", "{file}"], {}),
    ("answer", TL + ["exercises", "check", "leak", "--answer", "{latin1}"], {}),
    ("answer", TL + ["exercises", "check", "leak", "--answer", "{big}"], {}),
    # Python's own variables: an encoding that cannot show the kit's characters, warnings as errors.
    ("python", TL + ["reproduce", "nosuchfinding"], {"PYTHONIOENCODING": "ascii"}),
    ("python", TL + ["exercises", "check", "nosuch", "--answer", "{file}"],
     {"PYTHONIOENCODING": "ascii"}),
    ("python", TL + ["reproduce", "nosuchfinding"], {"PYTHONWARNINGS": "error"}),
    # Ports and addresses: out of range, not a number, not this machine's, malformed.
    ("address", TL + ["lab", "--no-browser", "--port", "0"], {}),
    ("address", TL + ["lab", "--no-browser", "--port", "abc"], {}),
    ("address", TL + ["up", "--port", "99999"], {}),
    ("address", TL + ["lab", "--no-browser", "--ip", "10.255.255.1"], {}),
    ("address", TL + ["lab", "--no-browser", "--ip", "[::1"], {}),
    ("address", TL + ["status"], {"TENANTLAB_PORT": "70000"}),
    # up/down manage only the embedded server.
    ("embedded", TL + ["--database-url", GOOD_DSN, "up"], {}),
    ("embedded", TL + ["--database-url", GOOD_DSN, "down"], {}),
    ("embedded", TL + ["--database-url", GOOD_DSN, "down", "--purge"], {}),
]

# {bad_password} is the admin's DSN with a wrong password, {no_db} the admin's DSN on a
# database that does not exist.
SERVER: list[tuple[str, list[str], dict[str, str]]] = [
    ("login", TL + ["status"], {"TENANTLAB_DATABASE_URL": "{bad_password}"}),
    ("login", TL + ["worker", "--dsn", "{bad_password}", "--until-empty"], {}),
    ("login", JQ + ["schema", "--dsn", "{bad_password}"], {}),
    ("login", JQ + ["reap", "--dsn", "{bad_password}"], {}),
    ("login", JQ + ["--handlers", "tenantlab.kinds"], {"JOBQUEUE_DSN": "{bad_password}"}),
    ("database", TL + ["status"], {"TENANTLAB_DATABASE_URL": "{no_db}"}),
    ("database", TL + ["reap", "--dsn", "{no_db}"], {}),
    ("database", TL + ["enqueue", "--kind", "sleep", "--dsn", "{no_db}"], {}),
    ("database", JQ + ["migrate", "--dsn", "{no_db}"], {}),
    ("database", JQ + ["--handlers", "tenantlab.kinds", "--dsn", "{no_db}"], {}),
]


# libpq's and Python's own variables in the shell, against the session's server ({admin}).
SHELL_ENV: list[tuple[str, list[str], dict[str, str]]] = [
    ("libpq", TL + ["exercises", "check", "leak", "--answer", "{answer}"],
     {"TENANTLAB_DATABASE_URL": "{admin}", "PGCONNECT_TIMEOUT": "abc"}),
    ("libpq", TL + ["exercises", "check", "leak", "--answer", "{answer}"],
     {"TENANTLAB_DATABASE_URL": "{admin}", "PGOPTIONS": "-c default_transaction_read_only=on"}),
    ("libpq", TL + ["exercises", "check", "poison", "--answer", "{answer}"],
     {"TENANTLAB_DATABASE_URL": "{admin}", "PGCONNECT_TIMEOUT": "-"}),
    ("python", TL + ["exercises", "check", "leak", "--answer", "{broken}"],
     {"TENANTLAB_DATABASE_URL": "{admin}", "PYTHONIOENCODING": "ascii"}),
]


def _environment(tmp: Path) -> dict[str, str]:
    """The caller's environment without the kit's variables: each row sets its own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TENANTLAB_", "JOBQUEUE_")) and k != "DATABASE_URL"}
    # A home of its own: a row that got past its check would find no server to act on.
    return env | {"TENANTLAB_HOME": str(tmp / "home"), "PYTHONPATH": str(ROOT)}


def _run(argv: list[str], env: dict[str, str]) -> tuple[int | None, str, str]:
    """Return the exit status (None: killed at the timeout), stdout and stderr."""
    try:
        done = subprocess.run([sys.executable, *argv], env=env, capture_output=True,
                              text=True, timeout=TIMEOUT, cwd=ROOT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out, err
    return done.returncode, done.stdout, done.stderr


def _check(table: list[tuple[str, list[str], dict[str, str]]], tmp: Path,
           fill: dict[str, str], *, status: int | None = None) -> None:
    """Run every row four at a time; collect every row that fails, then report them all."""
    base = _environment(tmp)
    jobs = [([a.format(**fill) for a in argv], base | {k: v.format(**fill) for k, v in env.items()},
             category) for category, argv, env in table]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda job: _run(job[0], job[1]), jobs))
    failures = []
    for (argv, env, category), (code, out, err) in zip(jobs, results, strict=True):
        row = f"[{category}] {' '.join(argv[1:])} {_shown(env, base)}".strip()
        lines = err.strip().splitlines()
        if code is None:
            failures.append(f"{row}: still running after {TIMEOUT} s")
        elif code == 0:
            failures.append(f"{row}: exit 0")
        elif status is not None and code != status:
            failures.append(f"{row}: exit {code}, not {status}: {err.strip()[:300]}")
        if "Traceback" in out + err:
            failures.append(f"{row}: traceback:\n{err[-600:]}")
        elif len(lines) > 2 or not lines:
            failures.append(f"{row}: {len(lines)} lines on stderr:\n{err[:600]}")
    assert not failures, "\n".join(failures)


def _shown(env: dict[str, str], base: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items() if base.get(k) != v)


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "a-file").write_text("not a directory\n")
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "latin1.sql").write_bytes("set local app.tenant = %(tenant)s -- é\n".encode("latin-1"))
    (tmp_path / "big.sql").write_bytes(b"-- " + b"x" * 1_100_000 + b"\n")
    return {"file": str(tmp_path / "a-file"), "dir": str(tmp_path / "a-dir"),
            "latin1": str(tmp_path / "latin1.sql"), "big": str(tmp_path / "big.sql")}


def test_bad_flags_and_variables_are_one_or_two_lines(tmp_path: Path, paths: dict[str, str]
                                                      ) -> None:
    assert len(OFFLINE) >= 40
    # Every class of bad input has several rows (issue 33's classes among them).
    rows = {category: sum(row[0] == category for row in OFFLINE + SERVER + SHELL_ENV)
            for category, _, _ in OFFLINE + SERVER + SHELL_ENV}
    assert min(rows.values()) >= 3, rows
    _check(OFFLINE, tmp_path, paths, status=2)


def test_a_refused_login_or_a_missing_database_is_configuration(admin_dsn: str,
                                                                 tmp_path: Path) -> None:
    fill = {"bad_password": make_conninfo(admin_dsn, password="not-the-password"),
            "no_db": make_conninfo(admin_dsn, dbname="tenantlab_no_such_database")}
    assert conninfo_to_dict(fill["no_db"])["dbname"] == "tenantlab_no_such_database"
    _check(SERVER, tmp_path, fill, status=2)


def test_libpq_and_python_variables_in_the_shell_are_one_or_two_lines(
        admin_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "answer.sql").write_text("set local app.tenant = %(tenant)s")
    (tmp_path / "broken.sql").write_text("select café from nowhere_é")  # not yet, in ascii
    fill = {"admin": admin_dsn, "answer": str(tmp_path / "answer.sql"),
            "broken": str(tmp_path / "broken.sql")}
    _check(SHELL_ENV[:3], tmp_path, fill)
    code, out, err = _run([a.format(**fill) for a in SHELL_ENV[3][1]],
                          _environment(tmp_path) | {k: v.format(**fill)
                                                    for k, v in SHELL_ENV[3][2].items()})
    assert code == 1 and out.startswith("not yet: ") and "Traceback" not in err, (out, err)


def test_a_refused_reconnect_is_configuration_not_an_outage() -> None:
    """Refused after the start (a password changed): the worker stops, it does not wait."""
    import psycopg

    refused = psycopg.OperationalError('connection to server at "h", port 5432 failed: '
                                       'FATAL:  password authentication failed for user "w"')
    gone = psycopg.OperationalError("server closed the connection unexpectedly")
    missing = psycopg.OperationalError('FATAL:  database "x" does not exist')
    assert preflight.refused_login(refused) == "login"
    assert preflight.refused_login(missing) == "database"
    assert preflight.refused_login(gone) is None
    assert preflight.refused_login(ValueError("x")) is None


def test_a_worker_refused_on_reconnect_stops_with_a_configuration_error(monkeypatch) -> None:
    import psycopg
    from jobqueue import ConfigError, Handlers
    from jobqueue import worker as w

    tries = []

    def refuse(dsn: str, name: str, **kw: object) -> None:
        tries.append(name)
        raise psycopg.OperationalError('FATAL:  password authentication failed for user "w"')

    monkeypatch.setattr(w, "preflight", lambda dsn, name, **kw: None)  # it passed at the start
    monkeypatch.setattr(w, "connect", refuse)
    worker = w.Worker("host=nowhere", handlers=Handlers({"noop": lambda claim: None}))
    with pytest.raises(ConfigError, match="cannot log in"):
        worker.run()
    assert len(tries) == 1
