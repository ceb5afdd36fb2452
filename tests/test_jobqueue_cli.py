"""The production worker's command line on the lab's network proxy: an outage, not an error.

The rest of its command line's cases are jobqueue's own (jobqueue/tests/test_cli.py); this one
needs the kit's TCP proxy (tenantlab.netproxy) to take the server away under a running worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tenantlab import db
from tenantlab.netproxy import Proxy

WAIT = 30.0
GOOD = """
    from jobqueue import Handlers
    handlers = Handlers({"noop": lambda conn, job: None})
"""


def start_worker(home: Path, dsn: str, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBQUEUE_", "PG"))}
    env["PYTHONPATH"] = str(home)
    return subprocess.Popen([sys.executable, "-m", "jobqueue", "worker", *args, "--dsn", dsn],
                            cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


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


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "good_handlers.py").write_text(textwrap.dedent(GOOD))
    return tmp_path


def test_a_server_that_was_reachable_and_went_away_is_an_outage(home: Path,
                                                                scratch: db.Scratch) -> None:
    proxy = Proxy(int(conninfo_to_dict(scratch.worker)["port"]))
    dsn = make_conninfo(scratch.worker, host="127.0.0.1", port=str(proxy.port))
    proc = start_worker(home, dsn, "--handlers", "good_handlers", "--max-outage", "1")
    try:
        with scratch.connect("admin", "test cli", autocommit=True) as admin:
            # The serving session, not the preflight's (tagged "... preflight") nor the
            # heartbeat's (opened at start too, "... heartbeat"): a server gone
            # during the preflight was never reached, a configuration error (2), no outage.
            wait_for("the worker's session", lambda: admin.execute(
                "select count(*) from pg_stat_activity where datname = current_database() "
                "and application_name like 'jobqueue worker-%%' "
                "and application_name not like '%% preflight' "
                "and application_name not like '%% heartbeat'").fetchone()[0] == 1, proc)
        proxy.close()  # the server goes away: its sessions cut, new connections refused
        code, err = finish(proc)
    finally:
        proxy.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 3, err
    assert "Traceback" not in err
    assert err.count("lost the server") == 1, err  # one line per outage, not per retry
