"""Write and read the workers' event log: one JSON object per line, one line per event.

A worker (and the reaper) appends ``{"t", "worker", "pid", "event", ...}`` lines to stdout or a
file; experiments read them back to draw timelines. Events: ``worker-start``, ``claim``,
``execute``, ``finish``, ``fail``, ``dead``, ``fenced``, ``crash`` (written just before the
process ends itself), ``idle``, ``reap``, ``stop-requested``, ``worker-stop``; with a heartbeat
(jobqueue's heartbeat.py) also ``heartbeat``, ``heartbeat-failed``, ``lease-lost`` and
``abandon`` (maximum runtime reached); from the outside-world kind ``stuck`` and ``outside``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO


class EventLog:
    """Append one JSON line per event for one worker; each line is a single write."""

    def __init__(self, worker: str, target: str | Path | TextIO | None = None) -> None:
        self.worker = worker
        self.pid = os.getpid()
        self._fd: int | None = None
        self._stream: TextIO | None = None
        if target is None or target == "-":
            self._stream = sys.stdout
        elif isinstance(target, str | Path):
            # O_APPEND: several worker processes may share one file; a line is one write.
            self._fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        else:
            self._stream = target

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "worker": self.worker, "pid": self.pid,
                           "event": event, **fields}, default=str) + "\n"
        if self._fd is not None:
            os.write(self._fd, line.encode())
        elif self._stream is not None:
            self._stream.write(line)
            self._stream.flush()  # a crash must not lose the line before it

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class NullLog(EventLog):
    """An event log that writes nothing (benchmarks, library use)."""

    def __init__(self, worker: str = "worker") -> None:
        self.worker, self.pid, self._fd, self._stream = worker, os.getpid(), None, None

    def emit(self, event: str, **fields: Any) -> None:
        pass


def read(path: str | Path) -> list[dict[str, Any]]:
    """Return the events written so far (a half-written last line is skipped)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
