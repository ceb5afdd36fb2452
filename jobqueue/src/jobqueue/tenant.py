"""Set the tenant context for one transaction only: the form that cannot leak.

The application's row-level-security policies read a setting, ``app.tenant`` unless the worker
is told another (``WorkerOptions.tenant_setting``, ``--tenant-setting``). Set with
``set_config(..., true)`` it ends with the transaction, whatever its outcome, so the next job
on the same connection starts with no tenant (the session form would hand it over). The
setting's name is a bound value, like the tenant: never formatted into SQL.
"""

from __future__ import annotations

import re

import psycopg
from psycopg.pq import TransactionStatus

from .jobs import ConfigError, JobQueueError, TenantId, check_tenant
from .queries import q

#: The setting a job's tenant goes to unless the worker is told another.
DEFAULT_TENANT_SETTING = "app.tenant"
#: A custom setting PostgreSQL accepts: two or more identifiers joined by dots.
_SETTING = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)+")


class TenantContextError(JobQueueError):
    """The tenant context cannot be set the way it was asked for."""


def check_setting(name: str) -> str:
    """Return `name` if it can hold the tenant (a custom setting, ``prefix.name``); else raise."""
    if not isinstance(name, str) or not _SETTING.fullmatch(name):
        raise ConfigError(f"tenant-setting must be a custom setting such as 'app.tenant' (two or "
                          f"more names joined by dots), not {name!r}")
    return name


def set_tenant_local(conn: psycopg.Connection, tenant: TenantId,
                     setting: str = DEFAULT_TENANT_SETTING) -> None:
    """Make `tenant` the tenant context of the transaction in progress on `conn`.

    `setting` is the name the application's policies read (default ``app.tenant``).
    """
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
    try:
        check_setting(setting)
    except ConfigError as e:
        raise TenantContextError(str(e)) from None
    conn.execute(q("tenant_set_local"), {"tenant": str(tenant), "setting": setting})
