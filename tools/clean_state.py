"""`make clean` without .venv: remove what the kit put on the machine for this checkout.

The same paths as `tenantlab down --purge` (``Server.state_paths``: the state directory, the
copy of PostgreSQL's binaries made for the server user, an emptied /var/lib/tenantlab), unless
a lab, an orphaned JupyterLab or a server still runs on them (a server in a state directory
inside, as the suite's .tenantlab/gw1, too): without .venv there are no binaries to stop a server
with.
Standard library only: ``tenantlab.server`` and ``tenantlab.labs`` loaded without the package's
dependencies.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_pkg = types.ModuleType("tenantlab")
_pkg.__path__ = [str(ROOT / "tenantlab")]
sys.modules.setdefault("tenantlab", _pkg)

from tenantlab import labs, server  # noqa: E402


def main() -> int:
    s = server.embedded()
    try:
        labs.refuse_while_running(s.home, servers=True)
    except labs.LabsRunning as e:
        print(f"make clean: {e}", file=sys.stderr)
        return 1
    if (s.data / "postmaster.pid").exists():
        print(f"make clean: a server may still run in {s.home} and .venv is gone: stop it with "
              "pg_ctl, then run `make clean` again", file=sys.stderr)
        return 1
    for path in s.remove_state():
        print(f"removed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
