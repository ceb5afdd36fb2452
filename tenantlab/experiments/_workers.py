"""Run child worker processes for an experiment, with an event log and a live timeline.

``with workers_run("crash", live) as run:`` gives a scratch database (``run.scratch``), an
event log file that every worker appends to, and ``run.start(...)`` / ``run.wait(proc)`` that
redraw the live timeline while they wait. Everything is ended on the way out, also on Ctrl-C.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from .. import db, events, worker
from ..charts import timeline


class WorkersRun:
    def __init__(self, scratch: db.Scratch, fleet: worker.Fleet, path: Path,
                 live: Any = None) -> None:
        self.scratch, self.fleet, self.path, self.live = scratch, fleet, path, live
        self.t0 = time.time()

    def start(self, **options: Any) -> subprocess.Popen:
        """Start one worker process (options as for ``tenantlab.worker.command``)."""
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
        return timeline.frame(events.read(self.path), self.t0)

    def tick(self) -> None:
        if self.live is not None:
            self.live.update(self.events())


@contextmanager
def workers_run(label: str, live: Any = None) -> Iterator[WorkersRun]:
    with (db.scratch(label) as s, tempfile.TemporaryDirectory(prefix="tenantlab-") as tmp,
          worker.fleet(s.worker) as fleet):
        run = WorkersRun(s, fleet, Path(tmp) / "events.jsonl", live)
        yield run
        run.tick()
