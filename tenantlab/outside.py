"""The outside world: a side effect that no database transaction can take back.

Job kind ``outside`` works for the job's seconds, then calls the outside world, as an e-mail or
an API call would: it appends one JSON line (job, attempt, worker, pid, time) to a file. The
fence can roll back everything a late worker wrote to ``jobs`` and ``job_runs``, but not this
line, so the file counts every real execution (finding ``overrun``).

Configured from the environment, like a real outside world the worker cannot see into:

- ``TENANTLAB_OUTSIDE``: the file (default: ``tenantlab-outside.jsonl`` in the temp directory);
- ``TENANTLAB_OUTSIDE_HANG``: seconds the call hangs on a job's *first* attempt before it goes
  through (default 0): a stuck-but-alive worker. A retry finds the outside world answering.

Job kind ``outside_once`` makes the same call with an **idempotency key**, the job id: the
outside world takes effect once per key, as a payment API with an ``Idempotency-Key`` header
does, and records every call, with whether it took effect (finding ``restart``).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from . import settings

if TYPE_CHECKING:
    from jobqueue import Claim

FILE_ENV, HANG_ENV = "TENANTLAB_OUTSIDE", "TENANTLAB_OUTSIDE_HANG"


def path() -> Path:
    """Return the outside world's file for this process."""
    return settings.outside_file() or Path(tempfile.gettempdir()) / "tenantlab-outside.jsonl"


def hang() -> float:
    """Return how long a job's first call hangs, from TENANTLAB_OUTSIDE_HANG (0 when unset)."""
    text = settings.outside_hang() or "0"
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{HANG_ENV} must be a number of seconds, not {text!r}") from None
    if value < 0:
        raise ValueError(f"{HANG_ENV} must be 0 or more seconds, not {text!r}")
    return value


def call(conn: psycopg.Connection, claim: Claim) -> None:
    """Work for the job's seconds, then record one execution outside the database."""
    events = claim.events
    time.sleep(float(claim.payload.get("seconds") or 0))
    if claim.attempt == 1 and (stuck := hang()):
        events.emit("stuck", job=claim.id, attempt=claim.attempt, seconds=stuck)
        time.sleep(stuck)
    # No lease check before the call, on purpose: a check here would only narrow the window,
    # and the article's point is what happens when a late worker reaches this line.
    line = json.dumps({"t": time.time(), "job": claim.id, "attempt": claim.attempt,
                       "worker": claim.worker, "pid": os.getpid()}) + "\n"
    fd = os.open(path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())  # one write: several workers may append at once
    finally:
        os.close(fd)
    events.emit("outside", job=claim.id, attempt=claim.attempt)


def call_once(conn: psycopg.Connection, claim: Claim) -> None:
    """Work for the job's seconds, then call the outside world with the job id as the key."""
    time.sleep(float(claim.payload.get("seconds") or 0))
    key = f"job-{claim.id}"
    # The outside world's own dedupe: the first call with a key creates its marker, atomically
    # across processes (O_EXCL); a repeated call finds it and changes nothing.
    keys = path().with_name(path().name + ".keys")
    keys.mkdir(exist_ok=True)
    try:
        os.close(os.open(keys / key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        effect = True
    except FileExistsError:
        effect = False
    _append({"t": time.time(), "job": claim.id, "attempt": claim.attempt, "worker": claim.worker,
             "pid": os.getpid(), "key": key, "effect": effect})
    claim.events.emit("outside", job=claim.id, attempt=claim.attempt, key=key, effect=effect)


def _append(record: dict[str, Any]) -> None:
    fd = os.open(path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())  # one write: workers append at once
    finally:
        os.close(fd)


def read(file: str | Path) -> list[dict[str, Any]]:
    """Return every execution the outside world saw, in order."""
    try:
        text = Path(file).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]
