"""Set the tenant context for one transaction only: the form that cannot leak.

The application's row-level-security policies read ``app.tenant``. Set with
``set_config(..., true)`` it ends with the transaction, whatever its outcome, so the next job
on the same connection starts with no tenant (the session form would hand it over).
"""

from __future__ import annotations

import psycopg
from psycopg.pq import TransactionStatus

from .jobs import ConfigError, JobQueueError, TenantId, check_tenant
from .queries import q


class TenantContextError(JobQueueError):
    """The tenant context cannot be set the way it was asked for."""


def set_tenant_local(conn: psycopg.Connection, tenant: TenantId) -> None:
    """Make `tenant` the tenant context of the transaction in progress on `conn`."""
    try:
        check_tenant(tenant)
    except ConfigError as e:
        raise TenantContextError(str(e)) from None
    if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        # In autocommit the statement is its own transaction: the setting would end before the
        # next statement runs, and the job would silently see no rows.
        raise TenantContextError(
            "local tenant context needs a transaction: in autocommit, set it inside "
            "`with conn.transaction():`")
    conn.execute(q("tenant_set_local"), {"tenant": str(tenant)})
