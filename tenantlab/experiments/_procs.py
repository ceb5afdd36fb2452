"""Start child processes for an experiment and always end them, also on Ctrl-C."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("tenantlab")


@contextmanager
def spawned(argvs: list[list[str]], env: dict[str, str]) -> Iterator[list[subprocess.Popen]]:
    """Start one process per argv (with `env` added); on the way out stop, then kill, the rest."""
    procs: list[subprocess.Popen] = []
    try:
        for argv in argvs:
            procs.append(subprocess.Popen(argv, env=dict(os.environ, **env),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          text=True))
        yield procs
    finally:
        for p, err in end(procs):
            if err and p.returncode not in (0, -signal.SIGTERM):
                log.warning("pid %s exited %s: %s", p.pid, p.returncode, err[-500:])


def end(procs: list[subprocess.Popen]) -> list[tuple[subprocess.Popen, str]]:
    """Ask every live process to stop (SIGTERM), kill what is left after 10 s; their stderr."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    ended = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        ended.append((p, err or ""))
    return ended
