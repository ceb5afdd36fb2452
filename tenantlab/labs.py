"""Which `tenantlab lab` processes use the embedded server: one marker file per running lab.

A lab writes ``<home>/labs/<pid>-<random>.json`` before it starts anything and removes that one
marker, never another lab's, when it stops or fails to start. ``tenantlab down`` and ``make
clean`` refuse while a marker names a live process, and say which labs those are. A marker whose
process is gone (a lab killed with SIGKILL) is stale: ignored, and removed on the way, unless
the JupyterLab it started still runs (an orphan: on Linux JupyterLab ends with its lab, elsewhere
it may not): then the next lab, ``down`` and ``make clean`` name it and say how to stop it.
Each lab has a JupyterLab workspaces directory of its own beside its marker, removed with it:
a second lab, or a later one, does not reopen this lab's tabs.

The server a lab started belongs to the labs, not to that one lab: the last lab out stops it,
whichever of them started it, so a lab never loses its server under it. A server that was
running before any lab (``tenantlab up``) is left running. Markers, the "started by a lab"
note, starting and stopping the server happen under one file lock, so two labs starting and
stopping at once, or a ``down`` meanwhile, see each other.

Standard library and ``server`` only: ``make clean`` reads the markers without ``.venv``.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .errors import TenantlabError
from .server import Server, alive

DIRECTORY = "labs"
#: Written by a lab that started the server: the last lab out stops it.
STARTED = "server-started-by-a-lab"
#: The single marker of earlier versions: honoured while its process lives.
LEGACY = "lab.pid"


@dataclass(frozen=True)
class Lab:
    """A running lab: its process, and where its JupyterLab listens."""

    pid: int
    jupyter: str = "?"
    #: JupyterLab's own pid, once the lab started it.
    jupyter_pid: int | None = None
    #: The lab ended (kill -9, a closed terminal) and its JupyterLab did not.
    orphan: bool = False

    def describe(self) -> str:
        if self.orphan:
            return (f"JupyterLab pid {self.jupyter_pid} on {self.jupyter}, left running by a lab "
                    f"that ended (pid {self.pid}): stop it with `kill {self.jupyter_pid}`")
        return f"pid {self.pid} (JupyterLab on {self.jupyter})"


class LabsRunning(TenantlabError):
    """A command that would take the server away from running labs."""

    def __init__(self, home: Path, found: list[Lab], servers: list[Path] | None = None) -> None:
        if servers or all(lab.orphan for lab in found):
            what = [lab.describe() for lab in found] + [
                f"a server in {path} (stop it with `TENANTLAB_HOME={path} tenantlab down`)"
                for path in servers or []]
            super().__init__(f"still running on {home}: {'; '.join(what)}; then run again")
            return
        one = len(found) == 1
        who = "a lab still uses" if one else f"{len(found)} labs still use"
        stop = "stop it first (Ctrl-C where it runs)" if one else \
            "stop them first (Ctrl-C where they run)"
        super().__init__(f"{who} the server in {home}: "
                         f"{', '.join(lab.describe() for lab in found)}; {stop}, "
                         "or `tenantlab down --force`")


def directory(home: Path) -> Path:
    return home / DIRECTORY


def workspaces(home: Path, pid: int | None = None) -> Path:
    """Return the JupyterLab workspaces directory of the lab with this pid (this process)."""
    return directory(home) / f"{pid or os.getpid()}.workspaces"


def is_jupyter(pid: int) -> bool:
    """Return True when `pid` is a running JupyterLab (its command line names jupyterlab)."""
    if not alive(pid):
        return False
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        if sys.platform == "linux":
            return False
        try:  # macOS: no /proc
            args = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True,
                                  text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return False
    return "jupyterlab" in args or "jupyter-lab" in args


def note_jupyter(home: Path, pid: int) -> None:
    """Add JupyterLab's pid to this process's marker: an orphan is found by it."""
    for marker in directory(home).glob(f"{os.getpid()}-*.json"):
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        info["jupyter_pid"] = pid
        marker.write_text(json.dumps(info) + "\n")


def servers_inside(home: Path) -> list[Path]:
    """Return the state directories inside `home` whose server runs (the suite's .tenantlab/gw1):
    removing `home` would pull their data from under them."""
    if not home.is_dir():
        return []
    return [sub for sub in sorted(home.iterdir())
            if sub.is_dir() and (sub / "data" / "postmaster.pid").exists()
            and Server(sub).pid() is not None]


def running(home: Path, *, besides: Path | None = None) -> list[Lab]:
    """Return the labs running on this state directory (besides one marker); drop stale markers."""
    found: list[Lab] = []
    for marker in sorted(directory(home).glob("*.json")):
        if marker == besides:
            continue
        try:
            info = json.loads(marker.read_text())
            jpid = info.get("jupyter_pid")
            lab = Lab(int(info["pid"]), str(info.get("jupyter", "?")),
                      int(jpid) if jpid is not None else None)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours: never removed here
        if alive(lab.pid):
            found.append(lab)
        elif lab.jupyter_pid is not None and is_jupyter(lab.jupyter_pid):
            found.append(Lab(lab.pid, lab.jupyter, lab.jupyter_pid, orphan=True))
        else:
            marker.unlink(missing_ok=True)
            shutil.rmtree(workspaces(home, lab.pid), ignore_errors=True)
    try:
        pid = int((home / LEGACY).read_text().split()[0])
    except (OSError, IndexError, ValueError):
        pass
    else:
        if pid != os.getpid() and alive(pid):
            found.append(Lab(pid))
    return found


def refuse_while_running(home: Path, *, servers: bool = False) -> None:
    """Raise LabsRunning, naming them, when labs use the server in `home` (or an orphaned
    JupyterLab runs); with `servers`, also when a server runs in a state directory inside it."""
    found, inside = running(home), servers_inside(home) if servers else []
    if found or inside:
        raise LabsRunning(home, found, inside)


def orphans(home: Path) -> list[Lab]:
    """Return the JupyterLabs whose lab ended without them."""
    return [lab for lab in running(home) if lab.orphan]


@contextmanager
def locked(home: Path) -> Iterator[None]:
    """Hold the labs' lock of this state directory (an advisory file lock, any POSIX system)."""
    directory(home).mkdir(parents=True, exist_ok=True)
    with open(directory(home) / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def server_stopped(home: Path) -> None:
    """Forget that a lab started the server (it was stopped by hand, e.g. `tenantlab down`)."""
    (directory(home) / STARTED).unlink(missing_ok=True)


@contextmanager
def lab(server: Server, jupyter: str, port: int | None = None,
        external: str | None = None) -> Iterator[str]:
    """Mark a lab as running for the block and yield the admin DSN it uses.

    `external`: an admin URL (TENANTLAB_DATABASE_URL); the embedded server is then neither
    started nor stopped, but the marker still keeps ``make clean`` from removing the state
    directory (the worker's secret lives there). Otherwise the embedded server starts unless it
    runs (on `port`), and stops when the last lab leaves, if a lab started it.
    """
    home = server.home
    marker = directory(home) / f"{os.getpid()}-{secrets.token_hex(4)}.json"
    ready = False  # set up: from here on, the last lab out stops a server a lab started
    try:
        with locked(home):
            marker.write_text(json.dumps({"pid": os.getpid(), "jupyter": jupyter}) + "\n")
            if external:
                dsn = external
            else:
                others = running(home, besides=marker)
                if server.up(port=port):
                    (directory(home) / STARTED).touch()
                elif not others:
                    server_stopped(home)  # a note left by a lab that was killed: not ours now
                dsn = server.dsn()
            ready = True
        yield dsn
    finally:
        if directory(home).exists():  # else purged under us (`down --purge --force`)
            with locked(home):
                marker.unlink(missing_ok=True)
                shutil.rmtree(workspaces(home), ignore_errors=True)
                if (ready and not external and not running(home)
                        and (directory(home) / STARTED).exists()):
                    server.down()
                    server_stopped(home)
