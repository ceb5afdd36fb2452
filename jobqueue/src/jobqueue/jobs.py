"""Name what a worker holds and what became of it: ``Claim``, ``Outcome``, and the errors.

A leaf module: it imports nothing else of the package, so every other module (and an
application's handlers) can import it without a cycle.
"""

from __future__ import annotations

import traceback
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

Status = Literal["done", "failed", "queued", "dead", "fenced", "cancelled"]

#: Every worker-side connection (worker, heartbeat, reaper): TCP keepalives find a dead peer
#: (a dropped connection, a failed-over host) in about a minute instead of hours.
CONNECT: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                           "keepalives_count": 3, "connect_timeout": 10}

#: The longest duration an option takes: about 31 years. Longer ones overflow PostgreSQL's
#: timestamps once added to now (and would mean "never", which no option needs).
MAX_SECONDS = 1_000_000_000
#: The largest count an option takes unless it says otherwise (counts land in int columns).
MAX_COUNT = 1_000_000_000

#: A tenant id: the type the schema was installed with (bigint/integer, uuid or text).
TenantId = int | str | uuid.UUID


class JobQueueError(Exception):
    """The root of every error this package raises."""


class ConfigError(JobQueueError, ValueError):
    """An option that cannot work; the message says what is valid."""


class LeaseLost(JobQueueError):
    """The job no longer carries this worker's attempt: another attempt owns it now."""


class UnknownKind(JobQueueError, LookupError):
    """A job whose kind has no handler in this worker: it fails (counted) like any error."""


class Events(Protocol):
    """Where a worker reports what it does (claim, execute, finish, fail, heartbeat, ...)."""

    worker: str

    def emit(self, event: str, **fields: Any) -> None: ...


class NullEvents:
    """Report nothing: the default outside the lab (the log says what matters)."""

    def __init__(self, worker: str = "worker") -> None:
        self.worker = worker

    def emit(self, event: str, **fields: Any) -> None:
        pass


@dataclass
class Claim:
    """One claimed job: what a handler needs to run it, and the attempt this worker owns.

    ``payload`` is the job's JSON document; ``events`` lets a handler report on the worker's
    own event stream (a no-op unless the worker was given one). A long handler should ask
    ``cancelled()`` now and then and return early when it is true.
    """

    id: int
    tenant_id: TenantId
    attempt: int
    kind: str
    payload: dict[str, Any] = field(default_factory=dict)
    started: datetime | None = None  # when its work started (the fenced start's clock)
    run_id: int | None = None  # the job_runs row of this execution, written by its finish
    worker: str = "worker"
    events: Events = field(default_factory=NullEvents, repr=False, compare=False)
    #: Set by the heartbeat when it finds the job cancelled by an operator (``cancel ID``).
    cancel_seen: bool = field(default=False, repr=False, compare=False)

    def cancelled(self) -> bool:
        """Return True once the heartbeat has seen that this attempt's work is lost: an operator
        cancelled the job, its maximum runtime passed, or another attempt owns it now.

        Cooperative: nothing interrupts the handler. Return early when it is true: whatever the
        handler wrote rolls back anyway (its finish matches no row, fenced out). Seen at the
        heartbeat's next beat (every third of the lease by default); never without a heartbeat.
        """
        return self.cancel_seen


@dataclass
class Outcome:
    """What became of one claimed job.

    ``status``: done; failed (error not counted, job still queued: the lab's naive design
    only); queued (counted, retried after a backoff); dead (counted, out of attempts); fenced
    (another attempt owns the job, nothing this execution wrote was kept).
    """

    claim: Claim
    status: Status
    error: str | None = None
    result: Any = None
    #: jobs claimed in the same commit as this one's finish (a worker that goes on; see
    #: ``Leased.execute(claim_next=N)``): counted and leased, theirs to run next.
    claimed: list[Claim] = field(default_factory=list)


def check_tenant(tenant: Any) -> None:
    """Refuse a tenant id that is not an int, a str or a UUID (a bool is not an int here)."""
    if isinstance(tenant, bool) or not isinstance(tenant, int | str | uuid.UUID) or tenant == "":
        raise ConfigError(f"tenant must be an int, a str or a UUID, not {tenant!r}")


def error_text(error: BaseException) -> str:
    """Return the error in one bounded line of text: its type and message."""
    return f"{type(error).__name__}: {error}"[:500]


#: How long a failed attempt's recorded error may be (``job_runs.error``, ``jobs.last_error``).
ERROR_MAX = 2000


def error_detail(error: BaseException, frames: int = 3) -> str:
    """Return the error as ``last_error`` and ``job_runs.error`` keep it: bounded.

    Its type and message, then the last `frames` lines of its traceback (where it was raised),
    within ``ERROR_MAX`` characters: the message is cut first, the traceback's tail kept.
    """
    head = f"{type(error).__name__}: {error}".strip()
    tail = ""
    if error.__traceback__ is not None:
        summary = traceback.extract_tb(error.__traceback__)[-frames:]
        tail = "".join(f"\n  at {f.filename}:{f.lineno} in {f.name}" for f in summary)
    room = ERROR_MAX - len(tail)
    if len(head) > room:
        head = head[:max(room - 3, 0)] + "..."
    return (head + tail)[:ERROR_MAX]
