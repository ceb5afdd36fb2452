"""The handlers notebook 06 gives the exported worker: one reads, one writes, both then sleep.

Started as ``python -m jobqueue worker --handlers
tenantlab.experiments._vacuum_handlers``. Each runs in the job's transaction with the tenant
set locally, as any application's handler would; ``STATEMENT`` names the query each runs last
before its sleep, so the experiment can see in ``pg_stat_activity`` that the sleep has begun.
"""

from __future__ import annotations

import time

import psycopg
from jobqueue import Claim, Handlers

from ..queries import q

handlers = Handlers()

#: Per kind, the named query its handler runs just before it sleeps.
STATEMENT = {"read_then_sleep": "count_invoices", "write_then_sleep": "demo_write"}


def _sleep(job: Claim) -> None:
    time.sleep(float(job.payload.get("seconds") or 0))


@handlers.register("read_then_sleep")
def read_then_sleep(conn: psycopg.Connection, job: Claim) -> int:
    """Count the tenant's invoices, then sleep the job's seconds: it writes nothing."""
    row = conn.execute(q(STATEMENT["read_then_sleep"])).fetchone()
    _sleep(job)
    return int(row[0]) if row else 0


@handlers.register("write_then_sleep")
def write_then_sleep(conn: psycopg.Connection, job: Claim) -> None:
    """Write one row (job_writes), then sleep the job's seconds: it commits with the finish."""
    conn.execute(q(STATEMENT["write_then_sleep"]),
                 {"id": job.id, "attempt": job.attempt, "tenant": job.tenant_id})
    _sleep(job)
