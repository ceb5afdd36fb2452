"""Run jobqueue's own suite (jobqueue/tests) on the kit's server: `make test` calls it.

The suite runs from a venv that holds psycopg and pytest only (the versions of the kit's
lock), with jobqueue's source on its path and nothing of the kit: what an engineer who takes
the exported worker has. The suite needs only a PostgreSQL it may create databases and roles
on (JOBQUEUE_TEST_DSN); this gives it the kit's (TENANTLAB_DATABASE_URL, or the embedded
server, started for the run and stopped after unless it was running). Extra arguments go to
pytest. ``--kit-venv`` runs it with the kit's own interpreter instead (quicker to set up).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tenantlab import db

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements-dev.lock"
#: What the bare venv holds: the queue's one dependency, and the test runner.
BARE = ["psycopg[binary]", "pytest"]


def bare_venv() -> Path:
    """Return the python of a venv with psycopg and pytest only, made (once per lock) under
    .tenantlab/jobqueue-venv, pinned by the kit's lock (a constraints file)."""
    home = Path(os.environ.get("TENANTLAB_HOME") or ROOT / ".tenantlab")
    venv = home / "jobqueue-venv"
    python = venv / "bin" / "python"
    stamp = venv / "lock.sha256"
    want = hashlib.sha256(LOCK.read_bytes() + " ".join(BARE).encode()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == want:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # The lock's pins only (it also names the kit itself, which a constraints file may not).
    pins = venv / "constraints.txt"
    pins.write_text("".join(line + "\n" for line in LOCK.read_text().splitlines()
                            if re.match(r"[A-Za-z0-9_.\-]+==", line)))
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "-c", str(pins), *BARE], check=True)
    stamp.write_text(want)
    return python


def point_at_source(python: Path) -> None:
    """Put jobqueue's source on the venv's path (a .pth file: an editable install without a
    build backend), so that every python the tests start, whatever their env, imports it."""
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "jobqueue-source.pth").write_text(str(ROOT / "jobqueue" / "src") + "\n")


def main(argv: list[str]) -> int:
    kit = "--kit-venv" in argv
    argv = [a for a in argv if a != "--kit-venv"]
    python = Path(sys.executable) if kit else bare_venv()
    if not kit:
        point_at_source(python)
    env = {k: v for k, v in os.environ.items()
           if kit or not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    if not kit:
        alone = subprocess.run([str(python), "-c", "import tenantlab"], cwd=ROOT / "jobqueue",
                               env=env, capture_output=True)
        if alone.returncode == 0:
            print("jobqueue_suite: the bare venv sees the kit (tenantlab imports)", file=sys.stderr)
            return 2
    with db.server_session() as dsn:
        env["JOBQUEUE_TEST_DSN"] = dsn
        return subprocess.run([str(python), "-m", "pytest", *argv], cwd=ROOT / "jobqueue",
                              env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
