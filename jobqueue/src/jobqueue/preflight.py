"""Check once, at start, that the queue can work here: the DSN, the login, the database, the schema.

A worker, reaper or pruner started with a wrong configuration must say what is wrong in one
line and stop (exit 2, which a supervisor does not restart), not retry for ever as if the server
were down. So the first connection is classified: a malformed DSN, a failed login, a missing
database, a role without CONNECT, a host name that does not resolve, and a server that cannot
be reached are configuration errors (``ConfigError``); then ``migrations.check`` says whether the
schema is there, current, and granted to this role. A worker (and ``reap --loop``) waits for a
server that cannot be reached (``unreachable``: PostgreSQL starting after it) or takes no writes
(``check_writable``: a standby) as for any outage: its reconnect loop, exit 3 after
``--max-outage``. The one-shot commands do not wait.

Behind a transaction pooler (``pooler=True``) connections prepare no statements; what psycopg's
own prepared statements look like through one without it is ``pooler_error``.

Connection failures carry no SQLSTATE in libpq (the server's FATAL arrives before any result),
so the class comes from ``sqlstate`` when there is one and from libpq's message otherwise; an
unrecognised message still ends as a configuration error, only with a less specific hint.
"""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from . import migrations
from .jobs import CONNECT, ConfigError, JobQueueError
from .queries import q

APP = (__package__ or "jobqueue").split(".")[0]
log = logging.getLogger(APP)

AUTH_STATES = ("28P01", "28000")  # invalid_password, invalid_authorization_specification
NO_DATABASE = "3D000"  # invalid_catalog_name
PRIVILEGE = "42501"  # insufficient_privilege

# libpq's and the server's words for the same classes, for when there is no SQLSTATE.
_AUTH = re.compile(r"authentication failed|no password supplied|pg_hba\.conf|"
                   r"role \S+ does not exist|password is required", re.I)
_NO_DATABASE = re.compile(r"database \S+ does not exist", re.I)
_NO_HOST = re.compile(r"could not translate host name|Name or service not known|"
                      r"nodename nor servname", re.I)
_PRIVILEGE = re.compile(r"permission denied|CONNECT privilege", re.I)
# A server that answers but cannot take this session yet: waited for, not a configuration error
# (a worker started with its database, during a restart or a failover, or at max_connections or
# its role's connection limit).
_TRANSIENT = re.compile(r"too many clients|too many connections for role|"
                        r"remaining connection slots|starting up|shutting down|in recovery mode|"
                        r"not yet accepting connections", re.I)


def preflight(dsn: str, name: str = "worker", *, pooler: bool = False) -> None:
    """Connect once and check the schema; raise ConfigError saying what to fix.

    `name` tags the connection (``application_name``) as the command that checks. A server
    that cannot be reached is a ConfigError too, from the OperationalError (``unreachable``
    tells it apart: a worker waits for it as for any outage).
    """
    with connect_checked(dsn, f"{name} preflight", pooler=pooler) as conn:
        try:
            migrations.check(conn)
        except psycopg.errors.InsufficientPrivilege as e:
            raise ConfigError(f"role {conn.info.user!r} lacks a grant the queue needs "
                              f"({one_line(e)}): see the README's grants for the worker role"
                              ) from e


def connect_checked(dsn: str, name: str, *, pooler: bool = False) -> psycopg.Connection:
    """Open an autocommit connection; a failure to connect is a ConfigError saying what to fix.

    A server that answers "too many clients" or "starting up" is waited for (one log line),
    with capped jittered backoff: it is there, only not ready.
    """
    waited = 0
    while True:
        try:
            return _connect(dsn, name, pooler=pooler)
        except psycopg.OperationalError as e:
            if not _TRANSIENT.search(one_line(e)):
                raise ConfigError(diagnose(e)) from e
            if not waited:
                log.warning("%s: the server is not ready (%s): waiting", name, one_line(e))
            waited += 1
            time.sleep(random.uniform(0, min(5.0, 0.1 * 2 ** waited)))


def connect(dsn: str, name: str, *, pooler: bool = False) -> psycopg.Connection:
    """Open an autocommit worker connection, tagged and with TCP keepalives.

    ``pooler``: the DSN leads to a transaction pooler, where the next transaction may run on
    another server session: no prepared statements (psycopg's ``_pg3_N`` would meet another
    client's of the same name, or be missing).
    """
    return psycopg.connect(dsn, autocommit=True, application_name=f"{APP} {name}", **CONNECT,
                           **POOLER if pooler else {})


#: What a connection to a transaction pooler takes: psycopg prepares nothing.
POOLER: dict[str, Any] = {"prepare_threshold": None}


def _connect(dsn: str, name: str, *, pooler: bool = False) -> psycopg.Connection:
    try:
        return connect(dsn, name, pooler=pooler)
    except psycopg.ProgrammingError as e:
        # Raised by conninfo parsing, before any network: the DSN itself is malformed.
        raise ConfigError(f"the DSN is not a valid connection string ({one_line(e)}): write "
                          "postgresql://USER@HOST:PORT/DBNAME or 'host=... dbname=... user=...'"
                          ) from e


class StandbyServer(JobQueueError):
    """The server answers but takes no writes (a hot standby, or read-only sessions): an outage
    to wait out, as after a failover, not a configuration error."""


def check_writable(conn: psycopg.Connection) -> None:
    """Raise StandbyServer when `conn`'s server is in recovery or its sessions are read-only.

    Checked at each (re)connection, before the outage is over: a DSN that reaches a standby
    would otherwise "reconnect" successfully, fail at the first write (25006), and start over
    many times a second, each time a new outage that ``--max-outage`` never sees end.
    """
    row = conn.execute(q("server_writable")).fetchone()
    if row is None or (not row[0] and not row[1]):
        return
    where = f"{conn.info.host}:{conn.info.port}"
    if row[0]:
        raise StandbyServer(f"the server at {where} is a hot standby (in recovery, read-only): "
                            "waiting for a primary (a multi-host DSN takes "
                            "target_session_attrs=read-write)")
    raise StandbyServer(f"the server at {where} takes no writes (default_transaction_read_only "
                        "is on for this role or database): waiting for it to be writable")


def unreachable(error: BaseException) -> bool:
    """Return True when a ConfigError from ``connect_checked`` is a server that could not be
    reached (not a malformed DSN, a refused login or a missing database)."""
    cause = error.__cause__
    # A host name that does not resolve is a typo far more often than an outage.
    return (isinstance(cause, psycopg.OperationalError) and refused_login(cause) is None
            and not _NO_HOST.search(one_line(cause)))


#: SQLSTATEs of psycopg's own prepared statements (``_pg3_N``) through a transaction pooler
#: (PgBouncer in transaction mode, before 1.21 or with max_prepared_statements = 0): the next
#: transaction runs on a server session where another client prepared the same name
#: (42P05), where it does not exist (26000), or where it is another statement (08P01).
PREPARED_CLASH = ("42P05", "26000", "08P01")


def pooler_error(error: BaseException, conn: psycopg.Connection) -> bool:
    """Return True when `error` is psycopg's prepared statements meeting a transaction pooler
    on a connection that prepares them: the cure is the worker's ``--pooler``."""
    return (isinstance(error, psycopg.Error) and conn.prepare_threshold is not None
            and error.sqlstate in PREPARED_CLASH and "_pg3_" in str(error))


POOLER_HINT = ("psycopg's prepared statements clash through a transaction pooler (PgBouncer in "
               "transaction mode): start the worker with --pooler (WorkerOptions(pooler=True))")


def check_dsn(dsn: str, source: str = "the DSN") -> str:
    """Return `dsn` when libpq can parse it; else raise ConfigError naming `source` (a flag or
    a variable) and the two forms a DSN takes. Nothing is connected to."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        raise ConfigError(f"{source} is not a PostgreSQL connection string ({one_line(e)}): "
                          "write postgresql://USER@HOST:PORT/DBNAME or "
                          "'host=... dbname=... user=...'") from None
    return dsn


def refused_login(error: BaseException) -> str | None:
    """Return why a connection was refused for its configuration (a failed login, no such
    database, no CONNECT grant) as "login", "database" or "privilege"; None otherwise (the
    server unreachable or going away: maybe an outage)."""
    if not isinstance(error, psycopg.OperationalError):
        return None
    state = error.sqlstate or error.diag.sqlstate
    text = one_line(error)
    if state in AUTH_STATES or (state is None and _AUTH.search(text)):
        return "login"
    if state == NO_DATABASE or (state is None and _NO_DATABASE.search(text)):
        return "database"
    if state == PRIVILEGE or (state is None and _PRIVILEGE.search(text)):
        return "privilege"
    return None


def diagnose(error: BaseException) -> str:
    """Return one line naming why a first connection failed and what to change."""
    refused = refused_login(error)
    text = one_line(error).removeprefix("connection failed: ")
    if refused == "login":
        return (f"cannot log in ({text}): check the user and password in the DSN "
                "(or PGPASSWORD, ~/.pgpass) and that pg_hba.conf lets this role in")
    if refused == "database":
        return (f"no such database ({text}): check the database name in the DSN; a new "
                "database needs the queue's migrations (`migrate`) before workers start")
    if refused == "privilege":
        return (f"the role may not connect ({text}): grant connect on the database to it")
    # Never reached is not an outage: only a server that was reachable and went away is.
    return (f"cannot reach the server ({text}): check the host and port in the DSN, and that "
            "PostgreSQL runs there")


def one_line(error: BaseException) -> str:
    """Return the error's message on one line, whitespace collapsed."""
    return " ".join(str(error).split()) or type(error).__name__
