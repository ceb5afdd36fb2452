"""Queue jobs: one (``enqueue``), thousands in one statement (``enqueue_many``), sync or async.

Every function runs in the caller's transaction (the jobs exist, and the idle workers are woken,
when it commits) and returns the jobs' ids. What a job may carry:

- ``queue`` (default ``'default'``): only workers that serve it claim it (``--queues``);
- ``priority`` (default 0, -10..10): higher runs first within what a worker serves;
- ``unique_key``: while a job with this key is queued or running, enqueueing the key again
  returns that job's id instead of a new job (a partial unique index decides, so two
  transactions enqueueing the same key at once get one job);
- ``run_after``: a datetime, or seconds (a number or a timedelta) from now;
- ``known``: the kinds the application runs (a ``Handlers``, or any container of kinds): a
  kind outside it is refused here (``UnknownKind``) instead of waiting for a worker forever.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .jobs import ConfigError, JobQueueError, TenantId, UnknownKind, check_tenant
from .queries import q

log = logging.getLogger((__package__ or "jobqueue").split(".")[0])

DEFAULT_QUEUE = "default"
PRIORITY_RANGE = (-10, 10)  # the column's check priority_in_range; the claims name each
#: Tries of a unique enqueue whose statement saw the key neither free nor taken (the job that
#: held it finished, or the one that took it committed, while the statement ran).
UNIQUE_TRIES = 10


@dataclass
class Job:
    """One job to queue with ``enqueue_many`` (a dict with the same keys works too)."""

    kind: str
    tenant: TenantId
    payload: Any = None
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    unique_key: str | None = None
    run_after: datetime | timedelta | float | None = None
    max_attempts: int = 3
    _delay: float | None = field(default=None, init=False, repr=False)


def check_queue(queue: Any) -> str:
    """Refuse a queue name that is not a non-empty string of at most 200 characters."""
    if not isinstance(queue, str) or not queue.strip() or len(queue) > 200 or "," in queue:
        raise ConfigError(f"a queue must be a non-empty name of at most 200 characters without "
                          f"commas, not {queue!r}")
    return queue


def parse_queues(queues: Iterable[str] | str) -> tuple[str, ...]:
    """Return the queues a worker serves from a list or ``'a,b'``: each once, none empty."""
    names = queues.split(",") if isinstance(queues, str) else list(queues)
    out = tuple(dict.fromkeys(check_queue(n.strip() if isinstance(n, str) else n)
                              for n in names))
    if not out:
        raise ConfigError("a worker serves at least one queue (default: 'default')")
    return out


def _check(job: Job, known: Container[str] | None) -> Job:
    check_tenant(job.tenant)
    if not isinstance(job.kind, str) or not job.kind:
        raise ConfigError(f"a job kind must be a non-empty string, not {job.kind!r}")
    if known is not None and job.kind not in known:
        names = ", ".join(sorted(known)) if isinstance(known, Iterable) else "?"
        raise UnknownKind(f"unknown job kind {job.kind!r}; known: {names or 'none registered'}")
    check_queue(job.queue)
    lo, hi = PRIORITY_RANGE
    if isinstance(job.priority, bool) or not isinstance(job.priority, int) \
            or not lo <= job.priority <= hi:
        raise ConfigError(f"priority must be a whole number from {lo} to {hi} (higher runs "
                          f"first), not {job.priority!r}")
    if job.unique_key is not None and (not isinstance(job.unique_key, str) or not job.unique_key):
        raise ConfigError(f"a unique key must be a non-empty string or None, not "
                          f"{job.unique_key!r}")
    if isinstance(job.max_attempts, bool) or not isinstance(job.max_attempts, int) \
            or job.max_attempts < 1:
        raise ConfigError(f"max_attempts must be at least 1, not {job.max_attempts!r}")
    when = job.run_after
    if isinstance(when, timedelta):
        job._delay = when.total_seconds()
    elif isinstance(when, int | float) and not isinstance(when, bool):
        job._delay = float(when)
    elif when is not None and not isinstance(when, datetime):
        raise ConfigError(f"run_after must be a datetime, a timedelta or seconds, not {when!r}")
    return job


def _job(spec: Job | Mapping[str, Any]) -> Job:
    if isinstance(spec, Job):
        return spec
    try:
        return Job(**spec)
    except TypeError as e:
        raise ConfigError(f"a job is a Job or a mapping with kind, tenant and optionally "
                          f"payload, queue, priority, unique_key, run_after, max_attempts: {e}") \
            from None


def _payload(payload: Any) -> Jsonb:
    json.dumps(payload)  # refuse what cannot be stored, here rather than in the worker
    return Jsonb(payload if payload is not None else {})


def _params(job: Job) -> dict[str, Any]:
    return {"tenant": job.tenant, "kind": job.kind, "payload": _payload(job.payload),
            "max_attempts": job.max_attempts, "queue": job.queue, "priority": job.priority,
            "unique_key": job.unique_key, "delay": job._delay,
            "run_after": job.run_after if isinstance(job.run_after, datetime) else None}


def _one(kind: str, tenant: TenantId, payload: Any, max_attempts: int, run_after: Any,
         queue: str, priority: int, unique_key: str | None,
         known: Container[str] | None) -> tuple[str, dict[str, Any]]:
    job = _check(Job(kind, tenant, payload, queue, priority, unique_key, run_after, max_attempts),
                 known)
    return q("enqueue_unique" if unique_key is not None else "enqueue"), _params(job)


def enqueue(conn: psycopg.Connection, kind: str, *, tenant: TenantId, payload: Any = None,
            max_attempts: int = 3, run_after: Any = None, queue: str = DEFAULT_QUEUE,
            priority: int = 0, unique_key: str | None = None,
            known: Container[str] | None = None) -> int:
    """Queue one job of `kind` for `tenant`; return its id (a live job's, for a unique key taken).

    Only workers that serve its queue and have a handler for its kind claim it; until one runs,
    it waits, queued. ``tenant``: an int, str or UUID (the type chosen at install).
    """
    _sync(conn, "enqueue")
    query, params = _one(kind, tenant, payload, max_attempts, run_after, queue, priority,
                         unique_key, known)
    for _ in range(UNIQUE_TRIES):
        row = conn.execute(query, params).fetchone()  # type: ignore[arg-type,unused-ignore]
        if row is not None:
            return int(row[0])
    raise JobQueueError(f"unique key {unique_key!r}: no live job and no insert after "
                        f"{UNIQUE_TRIES} tries")


async def enqueue_async(conn: psycopg.AsyncConnection, kind: str, *, tenant: TenantId,
                        payload: Any = None, max_attempts: int = 3, run_after: Any = None,
                        queue: str = DEFAULT_QUEUE, priority: int = 0,
                        unique_key: str | None = None,
                        known: Container[str] | None = None) -> int:
    """Queue one job on an ``AsyncConnection``: ``enqueue``'s arguments, its result."""
    query, params = _one(kind, tenant, payload, max_attempts, run_after, queue, priority,
                         unique_key, known)
    for _ in range(UNIQUE_TRIES):
        cur = await conn.execute(query, params)  # type: ignore[arg-type,unused-ignore]
        row = await cur.fetchone()
        if row is not None:
            return int(row[0])
    raise JobQueueError(f"unique key {unique_key!r}: no live job and no insert after "
                        f"{UNIQUE_TRIES} tries")


def _sync(conn: Any, name: str) -> None:
    if isinstance(conn, psycopg.AsyncConnection):
        raise ConfigError(f"{name} takes a psycopg.Connection; for an AsyncConnection, await "
                          f"{name}_async(conn, ...)")


# -- many jobs, one statement ----------------------------------------------------------------

#: From this many jobs on, a bulk operation (enqueue_many, retry_dead) asks for fresh statistics
#: (``jobqueue.analyze_after_bulk``, which also checks it): the plans every worker keeps for its
#: prepared statements were made with the table's size then, and a plan made on a few jobs reads
#: every row of a large queue (a claim after 100,000 queued: 3,097 buffers, about 40 ms, until
#: autoanalyze, about a minute later). Below it: no round trip; a few hundred rows more cost a
#: kept plan little.
BULK_ANALYZE = 1000
#: What a bulk goes on without analyzing: a schema from before 0006, a role not granted it.
NOT_ANALYZED = (psycopg.errors.UndefinedFunction, psycopg.errors.InsufficientPrivilege)


def analyze_after_bulk(conn: psycopg.Connection, jobs: int) -> None:
    """Ask for fresh statistics after a bulk of `jobs` (``jobqueue.analyze_after_bulk``).

    In a savepoint of the caller's transaction (or a transaction of its own): on a schema from
    before migration 0006 (an application upgraded before ``migrate``) the function is missing,
    or the role was not granted it; the bulk must not fail for it: the plans then wait for
    autoanalyze, as before (a missing grant is logged, once).
    """
    try:
        with conn.transaction():
            conn.execute(q("analyze_after_bulk"), {"jobs": jobs})
    except NOT_ANALYZED as e:
        _not_analyzed(e)


def _not_analyzed(e: psycopg.Error) -> None:
    """Log, once per process, that a role may not run analyze_after_bulk (a missing grant)."""
    global _UNGRANTED_LOGGED
    if isinstance(e, psycopg.errors.InsufficientPrivilege) and not _UNGRANTED_LOGGED:
        _UNGRANTED_LOGGED = True
        log.warning("a bulk was queued without fresh statistics: this role may not execute "
                    "jobqueue.analyze_after_bulk(bigint) (README, 'Grant three roles'); "
                    "running workers keep plans made for a small queue until autoanalyze")


_UNGRANTED_LOGGED = False


def _many(jobs: Iterable[Job | Mapping[str, Any]],
          known: Container[str] | None) -> tuple[list[Job], str, dict[str, Any]]:
    batch = [_check(_job(j), known) for j in jobs]
    # One JSON document for the batch (json_to_recordset on the server): one fast dump here
    # instead of an array adaptation per column; a value at its column's default is left out.
    rows = []
    # Inserted in unique-key order (the jobs without a key first, in the caller's order): two
    # calls that share keys then wait on each other's keys in one order, never in a cycle (in
    # the caller's order, 14 of 120 concurrent calls deadlocked). Ids still come back in the
    # caller's order (_ids matches them by key).
    for j in sorted(batch, key=lambda j: (j.unique_key is not None, j.unique_key or "")):
        row: dict[str, Any] = {"t": str(j.tenant), "k": j.kind}
        if j.payload is not None:
            row["p"] = j.payload
        if j.max_attempts != 3:
            row["m"] = j.max_attempts
        if j.queue != DEFAULT_QUEUE:
            row["q"] = j.queue
        if j.priority:
            row["r"] = j.priority
        if j.unique_key is not None:
            row["u"] = j.unique_key
        if isinstance(j.run_after, datetime):
            row["a"] = j.run_after.isoformat()
        elif j._delay is not None:
            row["d"] = j._delay
        rows.append(row)
    unique = any(j.unique_key is not None for j in batch)
    return batch, q("enqueue_many_unique" if unique else "enqueue_many"), \
        {"jobs": json.dumps(rows, separators=(",", ":"))}


def _ids(batch: list[Job], rows: list[tuple[Any, ...]]) -> tuple[list[int | None], list[str]]:
    """Match the inserted rows (in insertion order) to the jobs; return ids and keys not seen."""
    plain = iter([r[0] for r in rows if r[1] is None])
    by_key = {r[1]: r[0] for r in rows if r[1] is not None}
    ids: list[int | None] = []
    for j in batch:
        ids.append(next(plain) if j.unique_key is None else by_key.get(j.unique_key))
    return ids, [j.unique_key for j, i in zip(batch, ids, strict=True) if i is None
                 and j.unique_key is not None]


def enqueue_many(conn: psycopg.Connection, jobs: Iterable[Job | Mapping[str, Any]], *,
                 known: Container[str] | None = None) -> list[int]:
    """Queue many jobs in one statement; return their ids, in the jobs' order.

    Each job is a ``Job`` or a mapping with ``Job``'s fields. One INSERT ... SELECT FROM
    unnest(arrays) and one notification for all of them. A job whose unique key is taken (by a
    live job, or by an earlier job of the same call) gets that job's id.
    """
    _sync(conn, "enqueue_many")
    batch, query, params = _many(jobs, known)
    if not batch:
        return []
    rows = conn.execute(query, params).fetchall()  # type: ignore[arg-type,unused-ignore]
    if len(batch) >= BULK_ANALYZE:
        analyze_after_bulk(conn, len(batch))
    ids, missing = _ids(batch, rows)
    if missing:
        found = dict((k, i) for i, k in conn.execute(q("unique_ids"), {"keys": missing}))
        for n, j in enumerate(batch):
            if ids[n] is None:
                # Its key's job finished since the insert saw it: queue it on its own.
                ids[n] = found.get(j.unique_key) or enqueue(
                    conn, j.kind, tenant=j.tenant, payload=j.payload,
                    max_attempts=j.max_attempts, run_after=j.run_after, queue=j.queue,
                    priority=j.priority, unique_key=j.unique_key)
                found[j.unique_key] = ids[n]
    return [int(i) for i in ids if i is not None]


async def enqueue_many_async(conn: psycopg.AsyncConnection,
                             jobs: Iterable[Job | Mapping[str, Any]], *,
                             known: Container[str] | None = None) -> list[int]:
    """Queue many jobs in one statement on an ``AsyncConnection``: ``enqueue_many``'s result."""
    batch, query, params = _many(jobs, known)
    if not batch:
        return []
    cur = await conn.execute(query, params)  # type: ignore[arg-type,unused-ignore]
    ids, missing = _ids(batch, await cur.fetchall())
    if len(batch) >= BULK_ANALYZE:
        try:
            async with conn.transaction():
                await conn.execute(q("analyze_after_bulk"), {"jobs": len(batch)})
        except NOT_ANALYZED as e:
            _not_analyzed(e)  # see analyze_after_bulk
    if missing:
        cur = await conn.execute(q("unique_ids"), {"keys": missing})
        found = dict((k, i) for i, k in await cur.fetchall())
        for n, j in enumerate(batch):
            if ids[n] is None:
                ids[n] = found.get(j.unique_key) or await enqueue_async(
                    conn, j.kind, tenant=j.tenant, payload=j.payload,
                    max_attempts=j.max_attempts, run_after=j.run_after, queue=j.queue,
                    priority=j.priority, unique_key=j.unique_key)
                found[j.unique_key] = ids[n]
    return [int(i) for i in ids if i is not None]
