"""What the kit's two queues share as adapters: their tables, the bodies as handlers.

The naive row runs on the lab's schema (``jobqueue.jobs`` as the template has it: ``install``
has nothing to do); the jobqueue row installs the product's own (``db.install_product``:
``jobqueue migrate``, as the peers install theirs). Workers log in as the ordinary worker role.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import psycopg
from jobqueue import Claim, enqueue

from ... import __version__, db
from ...worker import worker_dsn
from .. import bodies
from ..adapter import Options, Setting, State

#: The kit's statuses are the suite's (a job waiting for its retry is ``queued``).
STATES: dict[str, State] = {"queued": "queued", "running": "running", "done": "done",
                            "dead": "dead", "failed": "failed", "cancelled": "dead"}


@dataclass
class KitRow:
    """A row of the kit's own queues: what naive and jobqueue share (the tables, the version,
    enqueue and states); each adds its settings, promises and worker command."""

    name: str = ""
    setting: Setting = "default"
    settings: dict[str, Any] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    promises: str = ""
    install_hint: str = "part of tenantlab"
    features: frozenset[str] = frozenset({"tenant-hook", "attempts", "pgbouncer"})

    def version(self) -> str | None:
        return f"tenantlab {__version__}"

    def install(self, dsn: str) -> None:
        install(dsn)

    def enqueue(self, dsn: str, kind: str, tenant: int, payload: dict[str, Any],
                options: Options) -> str:
        return add(dsn, kind, tenant, payload, options)

    def maintenance_command(self, dsn: str, options: Options) -> list[str] | None:
        return None

    def states(self, dsn: str) -> dict[str, State]:
        return states(dsn)

    def created(self, dsn: str) -> dict[str, float]:
        return created(dsn)


def install(dsn: str) -> None:
    """Nothing to do: the template's clone already holds the queue's tables."""


def add(dsn: str, kind: str, tenant: int, payload: dict[str, Any], options: Options) -> str:
    with db.connect(dsn, "suite enqueue", autocommit=True) as conn:
        return str(enqueue(conn, kind, tenant=tenant, payload=payload,
                           max_attempts=options.max_attempts))


def states(dsn: str) -> dict[str, State]:
    with db.connect(dsn, "suite states", autocommit=True) as conn:
        rows = conn.execute("select id::text, status from jobqueue.jobs").fetchall()
    return {job: STATES.get(status, "queued") for job, status in rows}


def created(dsn: str) -> dict[str, float]:
    """Each job's insert on the server's clock (``created`` is ``clock_timestamp()``)."""
    with db.connect(dsn, "suite created", autocommit=True) as conn:
        rows = conn.execute("select id::text, extract(epoch from created)::float8"
                            " from jobqueue.jobs").fetchall()
    return {job: float(t) for job, t in rows}


def python(module: str, dsn: str, history: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, "--dsn", worker_dsn(dsn), "--history", history, *args]


def work(history: str, conn: psycopg.Connection, job: Claim) -> None:
    """Run the suite's body for a claimed job on the job's own connection."""
    seen = None
    if job.kind == "tenant":
        seen = conn.execute("select current_setting('app.tenant', true)").fetchone()[0]  # type: ignore[index]
    bodies.run(history, job.kind, job.id, attempt=job.attempt, tenant=job.tenant_id,
               payload=job.payload, seen_tenant=seen)
    if job.kind == "tenant" and job.payload.get("session"):
        # The session form, as a careless per-job hook would set it.
        conn.execute("select set_config('app.tenant', %s, false)", (str(job.tenant_id),))
