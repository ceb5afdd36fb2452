"""Run child worker processes for an experiment, with an event log and a live timeline.

``Fleet`` starts ``tenantlab worker`` processes (a crashing job ends only its own process, never
the notebook kernel) and always ends them. ``with workers_run("crash", live) as run:`` gives a
scratch database (``run.scratch``), an event log file that every worker appends to, and
``run.start(...)`` / ``run.wait(proc)`` that redraw the live timeline while they wait.
Everything is ended on the way out, also on Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
from jobqueue.options import to_argv

from .. import db, events
from ..eventtable import frame
from ..worker import WorkerConfig
from ._procs import end

log = logging.getLogger("tenantlab")


def command(*, events: str | Path, **options: Any) -> list[str]:
    """Return the argv that starts one worker process (options: ``WorkerConfig``'s fields)."""
    return [sys.executable, "-m", "tenantlab", "worker", *to_argv(WorkerConfig(**options)),
            "--events", str(events)]


class Fleet:
    """Child worker processes that are always ended: ``with fleet(dsn) as f: f.start(...)``."""

    def __init__(self, dsn: str) -> None:
        # The DSN (with its password) goes through the environment, not the command line.
        self.env = dict(os.environ, TENANTLAB_DSN=dsn)
        self.procs: list[subprocess.Popen] = []

    def start(self, **options: Any) -> subprocess.Popen:
        """Start one worker (``events=`` the event log file, the rest ``WorkerConfig``'s fields)."""
        proc = subprocess.Popen(command(**options), env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen, timeout: float = 60.0, tick: Any = None) -> int:
        """Wait for one worker to exit, calling tick() every 0.2 s (live charts)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired as e:
                if tick:
                    tick()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"worker pid {proc.pid} still running after {timeout} s") from e
        if tick:
            tick()
        return code

    def close(self) -> None:
        """Ask every live worker to stop, then kill what is left; read their stderr."""
        for p, err in end(self.procs):
            if err and p.returncode not in (0, 1, -signal.SIGTERM):
                log.warning("worker pid %s exited %s: %s", p.pid, p.returncode, err[-500:])


@contextmanager
def fleet(dsn: str) -> Iterator[Fleet]:
    f = Fleet(dsn)
    try:
        yield f
    finally:
        f.close()


class WorkersRun:
    def __init__(self, scratch: db.Scratch, fleet: Fleet, path: Path,
                 live: Any = None) -> None:
        self.scratch, self.fleet, self.path, self.live = scratch, fleet, path, live
        self.t0 = time.time()
        self._next_draw = 0.0  # monotonic time before which tick() does not redraw

    def start(self, **options: Any) -> subprocess.Popen:
        """Start one worker process (options: ``WorkerConfig``'s fields)."""
        return self.fleet.start(events=self.path, **options)

    def wait(self, proc: subprocess.Popen, timeout: float = 60.0) -> int:
        """Wait for a worker to exit; return its exit code."""
        return self.fleet.wait(proc, timeout, tick=self.tick)

    def until(self, done: Callable[[], bool], timeout: float = 60.0) -> None:
        """Redraw every 0.2 s until done() is true."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"experiment step still not done after {timeout} s")
            self.tick()
            time.sleep(0.2)
        self.tick()

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        self.until(lambda: time.monotonic() >= end, seconds + 5)

    def stop(self, proc: subprocess.Popen, timeout: float = 30.0) -> int:
        """Ask a worker to stop after its current job (SIGTERM); return its exit code."""
        if proc.poll() is None:
            proc.terminate()
        return self.wait(proc, timeout)

    def log(self, name: str) -> events.EventLog:
        """Return an event log for in-process actors (the reaper) in the same file."""
        return events.EventLog(name, self.path)

    def events(self) -> pd.DataFrame:
        return frame(events.read(self.path), self.t0)

    def tick(self, *, force: bool = False) -> None:
        """Redraw the live chart, at most as often as leaves 4/5 of the time to the run.

        A redraw reads every event so far: with tens of thousands (the naive queue's poison
        loop) one costs a second, and redrawing every 0.2 s would make the drawing, not the
        workers, what the notebook waits for.
        """
        if self.live is None:
            return
        now = time.monotonic()
        if not force and now < self._next_draw:
            return
        self.live.update(self.events())
        self._next_draw = time.monotonic() + 4 * (time.monotonic() - now)


@contextmanager
def workers_run(label: str, live: Any = None) -> Iterator[WorkersRun]:
    with (db.scratch(label) as s, tempfile.TemporaryDirectory(prefix="tenantlab-") as tmp,
          fleet(s.worker) as workers):
        run = WorkersRun(s, workers, Path(tmp) / "events.jsonl", live)
        yield run
        run.tick(force=True)
