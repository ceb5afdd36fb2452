"""See the queue and act on it without SQL: ``stats``, ``jobs``, ``show``, ``retry``, ``cancel``.

Each function takes an autocommit connection (any role with select on the queue's tables; update
on ``jobqueue.jobs`` for ``retry`` and ``cancel``) and returns plain data, the shapes of the
command line's ``--json``:

- ``stats`` -> ``{"jobs": {STATUS: n}, "oldest_queued_s": float | None,
  "kinds_without_worker": [...], "by_kind": {KIND: {STATUS: n}}, "by_tenant": {...},
  "workers": [...], "lease_expired": [{"id", "kind", "tenant", "attempts", "max_attempts",
  "expired_s"}]}`` (running jobs no worker extends any more: stopped, starved or stuck);
- ``jobs`` -> ``[{"id", "kind", "tenant", "status", "attempts", "last_error"}]``, newest first;
- ``show`` -> the job's fields and ``"attempts": [{"attempt", "worker", "started", "finished",
  "outcome", "error"}]``: one per attempt counted, also those whose end was never recorded
  (outcome ``running`` for the attempt in flight, None for one whose worker vanished);
- ``retry`` / ``retry_dead`` -> the jobs queued again; ``cancel`` -> the status it had.

``retry`` refuses a job cancelled while running until that attempt's end is recorded or its
lease (no longer extended) runs out: a retry never runs beside the cancelled attempt.
``retry`` gives a dead (or cancelled) job a fresh budget: ``max_attempts`` becomes the attempts
so far plus ``attempts`` (default: the package's default budget, 3). The count goes on, never
back to 0, so the fence still tells every attempt apart. ``cancel`` never interrupts a handler:
a running job's heartbeat sees it (``claim.cancelled()``) and its finish matches no row.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .enqueue import BULK_ANALYZE, analyze_after_bulk
from .jobs import ConfigError, JobQueueError
from .queries import q

__all__ = ["NoSuchJob", "RETRY_ATTEMPTS", "STATUSES", "WrongState", "age", "cancel", "jobs", "retry",
           "retry_dead", "show", "stats"]

#: A retry's fresh budget unless told otherwise (enqueue's default max_attempts).
RETRY_ATTEMPTS = 3
STATUSES = ("queued", "running", "done", "dead", "cancelled")


class NoSuchJob(ConfigError, LookupError):
    """No job has this id (bad input: the command exits 2)."""


class WrongState(ConfigError):
    """The job is not in a state this action applies to (bad input: exit 2)."""


def server_now(conn: psycopg.Connection) -> datetime:
    """Return the server's clock: what ages and waits are measured by, never this host's."""
    row = conn.execute(q("server_now")).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def stats(conn: psycopg.Connection) -> dict[str, Any]:
    """Return counts per status (and per kind, per tenant), the oldest wait, idle kinds."""
    out: dict[str, Any] = {"jobs": dict.fromkeys(STATUSES, 0), "oldest_queued_s": None,
                           "kinds_without_worker": [], "by_kind": {}, "by_tenant": {},
                           "workers": []}
    for by, status, kind, tenant, n in conn.execute(q("stats_counts")).fetchall():
        if by == "status":
            out["jobs"][status] = n
        elif by == "kind":
            out["by_kind"].setdefault(kind, {})[status] = n
        else:
            out["by_tenant"].setdefault(str(tenant), {})[status] = n
    row = conn.execute(q("stats_oldest_queued")).fetchone()
    out["oldest_queued_s"] = row[0] if row else None
    out["kinds_without_worker"] = [r[0] for r in conn.execute(
        q("stats_kinds_without_worker")).fetchall()]
    with conn.cursor(row_factory=dict_row) as cur:
        out["workers"] = cur.execute(q("stats_workers")).fetchall()
        out["lease_expired"] = cur.execute(q("stats_lease_expired")).fetchall()
    return out


def jobs(conn: psycopg.Connection, *, status: str | None = None, kind: str | None = None,
         tenant: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Return the newest jobs matching every filter given (None: any)."""
    if status is not None and status not in STATUSES:
        raise WrongState(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(q("jobs_list"), {"status": status, "kind": kind, "tenant": tenant,
                                            "limit": limit}).fetchall()


def show(conn: psycopg.Connection, job: int) -> dict[str, Any]:
    """Return one job and its attempts, in order. Raises NoSuchJob."""
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(q("job_show"), {"id": job}).fetchone()
        if found is None:
            raise NoSuchJob(f"no job {job}")
        runs = cur.execute(q("job_attempts"), {"id": job}).fetchall()
    recorded = {r["attempt"] for r in runs}
    for n in range(1, found["attempts"] + 1):
        if n in recorded:
            continue
        # Counted at its claim, never recorded: in flight, or its worker went away before its
        # end (the lease ran out; the reaper or the next claim took the job over).
        in_flight = n == found["attempts"] and found["status"] == "running"
        runs.append({"attempt": n, "worker": None, "started": None, "finished": None,
                     "outcome": "running" if in_flight else None,
                     "error": None if in_flight else
                     "no record: its worker stopped or lost the server before the end"})
    found["attempts_made"] = found.pop("attempts")
    found["attempts"] = sorted(runs, key=lambda r: r["attempt"])
    return found


def retry(conn: psycopg.Connection, job: int, attempts: int = RETRY_ATTEMPTS) -> dict[str, Any]:
    """Queue a dead or cancelled job again with `attempts` more attempts; return it."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(q("retry_job"), {"id": job, "attempts": attempts}).fetchone()
    if row is None:
        running = conn.execute(q("cancelled_still_running"), {"id": job}).fetchone()
        if running is not None:
            raise WrongState(
                f"job {job} was cancelled while attempt {running[0]} ran, and that attempt may "
                f"still run (its lease holds for {max(running[2], 0):.1f} s more, not extended): "
                "retry it after that, so that it never runs twice at once")
        raise _state_error(conn, job, "only a dead or cancelled job can be retried")
    row.pop("pg_notify", None)
    return row


def retry_dead(conn: psycopg.Connection, *, kind: str | None = None, tenant: str | None = None,
               attempts: int = RETRY_ATTEMPTS,
               skipped: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Queue every dead job (of `kind`, of `tenant`) again, each with `attempts` more.

    A dead job whose unique key a live job holds stays dead (queueing it would make two live
    jobs of one key); so do the older of dead jobs sharing a key. They are appended to
    `skipped` (``{"id", "kind", "tenant", "unique_key", "held_by", "held_by_status"}``).
    """
    params = {"kind": kind, "tenant": tenant, "attempts": attempts}
    with conn.cursor(row_factory=dict_row) as cur:
        for tries_left in range(2, -1, -1):
            try:
                rows = cur.execute(q("retry_dead"), params).fetchall()
                break
            except psycopg.errors.UniqueViolation:
                # A job of one of these keys was enqueued while this ran: read again.
                if not tries_left or not conn.autocommit:
                    raise
        if len(rows) >= BULK_ANALYZE:
            # As enqueue_many: the workers' kept plans made again with the queue's real size.
            analyze_after_bulk(conn, len(rows))
        if skipped is not None:
            skipped.extend(cur.execute(q("retry_dead_skipped"), params).fetchall())
    for r in rows:
        r.pop("pg_notify", None)
    return rows


def cancel(conn: psycopg.Connection, job: int) -> str:
    """Cancel a queued or running job; return the status it had (queued or running)."""
    row = conn.execute(q("cancel_job"), {"id": job}).fetchone()
    if row is None:
        raise _state_error(conn, job, "only a queued or running job can be cancelled")
    return str(row[0])


def _state_error(conn: psycopg.Connection, job: int, what: str) -> JobQueueError:
    row = conn.execute(q("job_show"), {"id": job}).fetchone()
    if row is None:
        return NoSuchJob(f"no job {job}")
    return WrongState(f"job {job} is {row[3]}: {what}")


# -- presentation (the command line's human output) ---------------------------------------------

def age(seconds: float | None) -> str:
    """Return a duration as a short age: 42s, 3m05s, 2h10m, 4d03h; '-' for None."""
    if seconds is None:
        return "-"
    s = int(max(seconds, 0))
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def ago(when: datetime | None, now: datetime) -> str:
    return "-" if when is None else f"{age((now - when).total_seconds())} ago"


def table(rows: list[list[Any]], headers: list[str]) -> str:
    """Return rows as an aligned text table (numbers right-aligned)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    right = [bool(rows) and all(isinstance(r[i], int | float) for r in rows)
             for i in range(len(headers))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if r else v.ljust(w)
                         for v, w, r in zip(values, widths, right, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


def first_line(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = text.splitlines()[0]
    return line if len(line) <= width else line[:width - 3] + "..."


def to_json(data: Any) -> str:
    """Return data as JSON: datetimes in ISO 8601, UUIDs and the like as strings."""
    return json.dumps(data, indent=2, default=lambda v: v.isoformat()
                      if isinstance(v, datetime) else str(v))
