"""Run jobqueue's own suite (jobqueue/tests) on the kit's server: `make test` calls it.

The suite needs only a PostgreSQL it may create databases and roles on (JOBQUEUE_TEST_DSN);
this gives it the kit's (TENANTLAB_DATABASE_URL, or the embedded server, started for the run
and stopped after unless it was running). Extra arguments go to pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tenantlab import db

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    with db.server_session() as dsn:
        env = dict(os.environ, JOBQUEUE_TEST_DSN=dsn)
        return subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=ROOT / "jobqueue",
                              env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
