"""Set the tenant context on a connection, and the pool reset functions that clean it up.

The invoices policy reads ``app.tenant``. Set it in the *session* form and it outlives the job:
a pool that commits on success hands the next borrower the previous tenant (finding ``leak``).
Set it in the *local* form and it ends with the job's transaction, whatever the outcome. The
corrected path always uses the local form; the session form and the reset functions exist so
the experiments can show what they cost (finding ``reset``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from jobqueue import TenantContextError, set_tenant_local
from psycopg_pool import ConnectionPool

from . import db
from .queries import q

__all__ = ["TENANT_SETTING", "TenantContextError", "count_invoices", "current_tenant", "discard_all",
           "one_connection_pool", "pool_log", "reset_idle", "reset_leaving_transaction",
           "set_tenant", "set_tenant_local"]

POOL_LOGGER = "psycopg.pool"

#: The setting the lab's policies read (sql/lab/tenants.sql): the product's default too.
TENANT_SETTING = "app.tenant"

#: Keep psycopg's own default: the article's DISCARD ALL trap depends on it.
DEFAULT_PREPARE_THRESHOLD = 5

Reset = Callable[[psycopg.Connection], None]


def set_tenant(conn: psycopg.Connection, tenant: int, *, local: bool = True) -> None:
    """Make `tenant` the connection's tenant context: for this transaction (local) or session.

    The lab's tenants are ints (its invoices' key); the production worker takes any type.
    """
    if isinstance(tenant, bool) or not isinstance(tenant, int):
        raise TenantContextError(f"tenant must be an int, not {tenant!r}")
    if local:
        set_tenant_local(conn, tenant)  # the corrected worker's own form
        return
    conn.execute(q("tenant_set_session"), {"tenant": str(tenant)})


def count_invoices(conn: psycopg.Connection) -> int:
    """Return how many invoices the connection's tenant context lets it see."""
    return int(db.scalar(conn, q("count_invoices")))


def current_tenant(conn: psycopg.Connection) -> int | None:
    """Return the tenant context the connection carries now (None when there is none)."""
    row = conn.execute(q("tenant_current")).fetchone()
    return int(row[0]) if row and row[0] else None


def reset_idle(conn: psycopg.Connection) -> None:
    """Forget the session-form tenant and commit, so the pool gets the connection back idle."""
    conn.execute(q("tenant_reset"))
    conn.commit()


def discard_all(conn: psycopg.Connection) -> None:
    """Drop all session state with DISCARD ALL (in autocommit: it refuses a transaction block).

    A trap with psycopg's automatic prepared statements: the server forgets them, psycopg does
    not, and the next execution of a prepared query fails. Use with ``prepare_threshold=None``.
    """
    conn.autocommit = True
    try:
        conn.execute(q("tenant_discard_all"))
    finally:
        conn.autocommit = False


def reset_leaving_transaction(conn: psycopg.Connection) -> None:
    """Forget the tenant but leave the transaction RESET opened: the pool discards the connection.

    The trap of finding ``reset``: it looks clean (no context survives, because no connection
    does), and the only trace is the pool's warning in the log.
    """
    conn.execute(q("tenant_reset"))


def one_connection_pool(
    dsn: str,
    name: str,
    *,
    reset: Reset | None = None,
    autocommit: bool = False,
    prepare_threshold: int | None = DEFAULT_PREPARE_THRESHOLD,
) -> ConnectionPool:
    """Return an unopened pool of exactly one connection; use it as ``with pool: ...``."""
    kwargs: dict[str, Any] = {
        "application_name": f"{db.APP} {name}",
        "autocommit": autocommit,
        "prepare_threshold": prepare_threshold,
    }
    return ConnectionPool(
        dsn, min_size=1, max_size=1, kwargs=kwargs, reset=reset, open=False,
        name=f"{db.APP}-{name}",
    )


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def pool_log() -> Iterator[list[logging.LogRecord]]:
    """Collect what psycopg_pool logs (instead of printing it); yield the list of records."""
    logger = logging.getLogger(POOL_LOGGER)
    handler = _Collect()
    saved = logger.propagate, logger.level
    logger.addHandler(handler)
    # Not propagating keeps the warnings out of the notebook's stderr: the experiment shows them.
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.propagate, logger.level = saved
