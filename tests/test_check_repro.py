"""Every ✗ of a peer has a standalone script (tenantlab/check/repro/): each runs once here, all
at once (they mostly wait), each in a database of its own, with nothing of the kit on its path;
each must say REPRODUCED and leave no session behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

from tenantlab import db
from tenantlab.check import repro
from tenantlab.check.queues._peers import url

pytestmark = pytest.mark.slow


def _sessions(admin: str, names: list[str]) -> list[tuple[str, str]]:
    with db.connect(admin, "suite", autocommit=True) as conn:
        return conn.execute("select datname, coalesce(application_name, '') from "
                            "pg_stat_activity where datname = any(%s)", (names,)).fetchall()


def test_each_standalone_script_reproduces_its_failure(admin_dsn: str) -> None:
    for lib in ("awa", "pgqueuer", "procrastinate"):
        pytest.importorskip(lib)
    scripts = repro.all_scripts()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with contextlib.ExitStack() as stack:
        dbs = [stack.enter_context(db.scratch(f"repro_{s.stem}", admin_dsn)) for s in scripts]
        # From / with no kit on the path: the library and its driver only.
        procs = [subprocess.Popen([sys.executable, str(s), url(d.admin)], cwd="/", env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for s, d in zip(scripts, dbs, strict=True)]
        outs = [p.communicate(timeout=150)[0] for p in procs]
        names = [d.name for d in dbs]
        deadline = time.monotonic() + 5
        while _sessions(admin_dsn, names) and time.monotonic() < deadline:
            time.sleep(0.2)  # a killed worker's backend takes a moment to exit
        left = _sessions(admin_dsn, names)
    for s, p, out in zip(scripts, procs, outs, strict=True):
        assert p.returncode == 0 and "REPRODUCED" in out, f"{s.name}:\n{out}"
    assert left == []
