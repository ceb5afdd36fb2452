"""Which `tenantlab lab` processes use the embedded server: one marker file per running lab.

A lab writes ``<home>/labs/<pid>-<random>.json`` before it starts anything and removes that one
marker, never another lab's, when it stops or fails to start. ``tenantlab down`` and ``make
clean`` refuse while a marker names a live process, and say which labs those are. A marker whose
process is gone (a lab killed with SIGKILL) is stale: ignored, and removed on the way.

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

    def describe(self) -> str:
        return f"pid {self.pid} (JupyterLab on {self.jupyter})"


class LabsRunning(TenantlabError):
    """A command that would take the server away from running labs."""

    def __init__(self, home: Path, found: list[Lab]) -> None:
        one = len(found) == 1
        who = "a lab still uses" if one else f"{len(found)} labs still use"
        stop = "stop it first (Ctrl-C where it runs)" if one else \
            "stop them first (Ctrl-C where they run)"
        super().__init__(f"{who} the server in {home}: "
                         f"{', '.join(lab.describe() for lab in found)}; {stop}, "
                         "or `tenantlab down --force`")


def directory(home: Path) -> Path:
    return home / DIRECTORY


def running(home: Path, *, besides: Path | None = None) -> list[Lab]:
    """Return the labs running on this state directory (besides one marker); drop stale markers."""
    found: list[Lab] = []
    for marker in sorted(directory(home).glob("*.json")):
        if marker == besides:
            continue
        try:
            info = json.loads(marker.read_text())
            lab = Lab(int(info["pid"]), str(info.get("jupyter", "?")))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours: never removed here
        if alive(lab.pid):
            found.append(lab)
        else:
            marker.unlink(missing_ok=True)
    try:
        pid = int((home / LEGACY).read_text().split()[0])
    except (OSError, IndexError, ValueError):
        pass
    else:
        if pid != os.getpid() and alive(pid):
            found.append(Lab(pid))
    return found


def refuse_while_running(home: Path) -> None:
    """Raise LabsRunning, naming them, when labs use the server in `home`."""
    if found := running(home):
        raise LabsRunning(home, found)


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
                if (ready and not external and not running(home)
                        and (directory(home) / STARTED).exists()):
                    server.down()
                    server_stopped(home)
