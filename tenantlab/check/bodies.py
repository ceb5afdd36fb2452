"""The job bodies the suite owns: every execution leaves its evidence outside the database.

A worker process of any queue calls ``run`` (or ``run_async`` on an event loop) with the job's
kind, id, attempt (where the library exposes one), tenant and payload, and the history file.
Before the body and after it, one JSON line is appended to the history (``O_APPEND``, one
``write`` per line: lines of several processes never interleave); a body that kills its
process leaves a start without an end, which is the evidence of a crash.

Kinds (the payload's ``seconds`` is how long the slow ones take):

- ``ok``: return at once;
- ``poison``: raise ``Poison`` (an error every attempt);
- ``crash``: kill its own process (SIGKILL) mid-job;
- ``sleep``: wait ``seconds`` without blocking (``asyncio.sleep`` on a loop);
- ``block``: blocking work (``time.sleep(seconds)``) written as the libraries' docs say: on a
  thread of its own (``asyncio.to_thread`` on a loop, as PgQueuer's docs say; a sync task in a
  thread, as procrastinate's say);
- ``block-loop``: the same blocking work called straight on the event loop, against the docs
  (it blocks the loop, and whatever else runs on it: a heartbeat);
- ``tenant``: report the tenant the job's connection is set to (``tenant-leak``; the adapter
  passes ``seen_tenant``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
from typing import Any

KINDS = ("ok", "poison", "crash", "sleep", "block", "block-loop", "tenant")
_seq = itertools.count(1)


class Poison(Exception):
    """The error a poison job raises on every attempt."""


def record(history: str, **fields: Any) -> None:
    """Append one JSON line to the history file (one write, O_APPEND)."""
    line = (json.dumps(fields, default=str, separators=(",", ":")) + "\n").encode()
    fd = os.open(history, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _start(history: str, kind: str, job: Any, attempt: int | None, tenant: Any,
           seen_tenant: Any) -> str:
    execution = f"{os.getpid()}-{next(_seq)}"
    record(history, event="start", execution=execution, job=str(job), kind=kind,
           attempt=attempt, pid=os.getpid(), tenant=tenant, seen_tenant=seen_tenant,
           t=time.time())
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # SIGKILL is not caught; never reached
    return execution


def _end(history: str, execution: str, job: Any, outcome: str, error: str | None = None) -> None:
    record(history, event="end", execution=execution, job=str(job), pid=os.getpid(),
           outcome=outcome, error=error, t=time.time())


def run(history: str, kind: str, job: Any, *, attempt: int | None = None, tenant: Any = None,
        payload: dict[str, Any] | None = None, seen_tenant: Any = None) -> None:
    """Run one job's body in this thread (``sleep`` and ``block`` both sleep the thread)."""
    payload = payload or {}
    execution = _start(history, kind, job, attempt, tenant, seen_tenant)
    try:
        if kind == "poison":
            raise Poison(f"job {job} is poison")
        if kind in ("sleep", "block", "block-loop"):
            time.sleep(float(payload.get("seconds", 1.0)))
    except BaseException as e:
        _end(history, execution, job, "error", f"{type(e).__name__}: {e}")
        raise
    _end(history, execution, job, "ok")


async def run_async(history: str, kind: str, job: Any, *, attempt: int | None = None,
                    tenant: Any = None, payload: dict[str, Any] | None = None,
                    seen_tenant: Any = None) -> None:
    """Run one job's body on the event loop: ``sleep`` yields to it, ``block`` runs its blocking
    work on a thread (``asyncio.to_thread``, as the docs say), ``block-loop`` blocks the loop."""
    payload = payload or {}
    execution = _start(history, kind, job, attempt, tenant, seen_tenant)
    try:
        if kind == "poison":
            raise Poison(f"job {job} is poison")
        if kind == "sleep":
            await asyncio.sleep(float(payload.get("seconds", 1.0)))
        elif kind == "block":
            await asyncio.to_thread(time.sleep, float(payload.get("seconds", 1.0)))
        elif kind == "block-loop":
            time.sleep(float(payload.get("seconds", 1.0)))  # against the docs: blocks the loop
    except BaseException as e:
        _end(history, execution, job, "error", f"{type(e).__name__}: {e}")
        raise
    _end(history, execution, job, "ok")
