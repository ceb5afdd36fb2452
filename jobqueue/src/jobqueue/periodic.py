"""Periodic jobs: a job enqueued every interval or on a cron schedule, once per slot.

Declare them where the handlers are registered (the module a worker loads with ``--handlers``)::

    from jobqueue import schedules
    schedules.add("nightly-report", "report", tenant=1, cron="0 3 * * *")
    schedules.add("sync", "sync", tenant=1, every=300, queue="maintenance")

Every worker that has them checks them on each loop (a clock comparison; a statement only
when a slot may have come, and once a minute to read the server's clock again). The slots are
the database server's clock's, never the worker host's: a host whose clock is off neither
enqueues a slot early nor holds a schedule back for the others.
A slot is enqueued by the statement that moves the schedule's last slot
forward in ``jobqueue.periodic`` (``periodic_enqueue``): however many workers run, each slot is
enqueued once, and a worker that comes late (a slow clock, a long job) cannot enqueue a slot
again, even after its job finished. The job carries the unique key ``periodic:NAME@SLOT``.

Slots are UTC. An interval's slots are the multiples of it since the epoch; a cron's, the
minutes it matches (5 fields: minute hour day-of-month month day-of-week; ``*``, ``a-b``,
``*/n``, ``a-b/n``, lists, month and day names; ``@hourly``, ``@daily``, ``@weekly``,
``@monthly``, ``@yearly``; day-of-month and day-of-week both restricted = either matches, as in
cron). A new schedule starts at its next slot; after downtime, the most recent missed slot is
enqueued once and older ones are skipped (no catch-up storm).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .enqueue import DEFAULT_QUEUE, Job, _check
from .jobs import MAX_SECONDS, ConfigError, TenantId
from .queries import q

APP = (__package__ or "jobqueue").split(".")[0]
log = logging.getLogger(APP)

FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
          ("day of week", 0, 7))
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
ALIASES = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
           "@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *",
           "@annually": "0 0 1 1 *"}
#: How far a cron's next (or last) minute is looked for: a leap-year cycle and then some.
HORIZON_DAYS = 366 * 8 + 2


@dataclass(frozen=True)
class Cron:
    """A 5-field cron expression, parsed: the minutes it matches (UTC)."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month is '*'
    any_weekday: bool  # day of week is '*'

    @classmethod
    def parse(cls, text: str) -> Cron:
        """Read a cron expression; an invalid one is a ConfigError that says what is valid."""
        if not isinstance(text, str):
            raise ConfigError(f"a cron expression is a string, not {text!r}")
        expr = ALIASES.get(text.strip().lower(), text.strip())
        parts = expr.split()
        if len(parts) != 5:
            raise ConfigError(f"cron {text!r}: 5 fields (minute hour day-of-month month "
                              f"day-of-week) or one of {', '.join(ALIASES)}, not {len(parts)}")
        values = [_field(text, part, i) for i, part in enumerate(parts)]
        cron = cls(text, tuple(sorted(values[0])), tuple(sorted(values[1])),
                   frozenset(values[2]), frozenset(values[3]),
                   frozenset(d % 7 for d in values[4]), parts[2] == "*", parts[4] == "*")
        if cron.next_after(datetime(2000, 1, 1, tzinfo=UTC)) is None:
            raise ConfigError(f"cron {text!r} never matches a day (day {parts[2]} of month "
                              f"{parts[3]})")
        return cron

    def day_matches(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom, dow = d.day in self.days, (d.weekday() + 1) % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow  # both restricted: either one, as cron does

    def next_after(self, t: datetime) -> datetime | None:
        """Return the first matching minute strictly after `t` (None: none within 8 years)."""
        start = t.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        for n in range(HORIZON_DAYS):
            d = start.date() + timedelta(days=n)
            if not self.day_matches(d):
                continue
            for h in self.hours:
                for m in self.minutes:
                    at = datetime(d.year, d.month, d.day, h, m, tzinfo=UTC)
                    if at >= start:
                        return at
        return None

    def last_at_or_before(self, t: datetime) -> datetime | None:
        """Return the last matching minute at or before `t` (None: none within 8 years)."""
        end = t.astimezone(UTC)
        for n in range(HORIZON_DAYS):
            d = end.date() - timedelta(days=n)
            if not self.day_matches(d):
                continue
            for h in reversed(self.hours):
                for m in reversed(self.minutes):
                    at = datetime(d.year, d.month, d.day, h, m, tzinfo=UTC)
                    if at <= end:
                        return at
        return None

    def __str__(self) -> str:
        return self.text


def _number(text: str, expr: str, index: int) -> int:
    name, lo, hi = FIELDS[index]
    names = MONTHS if index == 3 else DAYS if index == 4 else ()
    low = text.lower()
    if low in names:
        return names.index(low) + (1 if index == 3 else 0)
    if not text.isdigit():
        valid = f"{lo}-{hi}" + (f" or {names[0]}-{names[-1]}" if names else "")
        raise ConfigError(f"cron {expr!r}: {name} {text!r} is not a number ({valid})")
    value = int(text)
    if not lo <= value <= hi:
        raise ConfigError(f"cron {expr!r}: {name} {value} is out of range {lo}-{hi}")
    return value


def _field(expr: str, part: str, index: int) -> set[int]:
    """Return the values one field matches: ``*``, ``a``, ``a-b``, each with ``/step``, lists."""
    name, lo, hi = FIELDS[index]
    out: set[int] = set()
    for item in part.split(","):
        body, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise ConfigError(f"cron {expr!r}: {name} step {step_text!r} must be a whole "
                                  "number of at least 1")
            step = int(step_text)
        if body == "*":
            first, last = lo, hi
        elif "-" in body:
            a, _, b = body.partition("-")
            first, last = _number(a, expr, index), _number(b, expr, index)
            if first > last:
                raise ConfigError(f"cron {expr!r}: {name} range {body!r} runs backwards")
        elif body:
            first = _number(body, expr, index)
            last = hi if slash else first
        else:
            raise ConfigError(f"cron {expr!r}: {name} has an empty item in {part!r}")
        out.update(range(first, last + 1, step))
    return out


@dataclass(frozen=True)
class Schedule:
    """One periodic job: its name (the slot's key), what to enqueue, and when (every or cron)."""

    name: str
    kind: str
    tenant: TenantId
    every: float | None = None
    cron: Cron | None = None
    payload: Any = None
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    max_attempts: int = 3

    def slot_at(self, now: datetime) -> datetime | None:
        """Return the latest slot at or before `now`."""
        if self.every is not None:
            epoch = now.timestamp()
            return datetime.fromtimestamp(math.floor(epoch / self.every) * self.every, UTC)
        assert self.cron is not None
        return self.cron.last_at_or_before(now)

    def next_after(self, t: datetime) -> datetime | None:
        """Return the first slot after `t`."""
        if self.every is not None:
            epoch = t.timestamp()
            return datetime.fromtimestamp((math.floor(epoch / self.every) + 1) * self.every, UTC)
        assert self.cron is not None
        return self.cron.next_after(t)

    def params(self, slot: datetime) -> dict[str, Any]:
        """Return the parameters of ``periodic_enqueue`` for `slot`."""
        return {"name": self.name, "slot": slot, "tenant": str(self.tenant), "kind": self.kind,
                "payload": Jsonb(self.payload if self.payload is not None else {}),
                "max_attempts": self.max_attempts, "queue": self.queue,
                "priority": self.priority,
                "unique_key": f"periodic:{self.name}@{slot.isoformat()}"}


class Schedules:
    """The application's periodic jobs, by name: ``schedules.add(NAME, KIND, ...)``."""

    def __init__(self) -> None:
        self._by_name: dict[str, Schedule] = {}

    def add(self, name: str, kind: str, *, tenant: TenantId, every: float | None = None,
            cron: str | None = None, payload: Any = None, queue: str = DEFAULT_QUEUE,
            priority: int = 0, max_attempts: int = 3) -> Schedule:
        """Declare a periodic job: every `every` seconds, or on the cron expression `cron`."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a schedule's name must be a non-empty string, not {name!r}")
        if name in self._by_name:
            raise ConfigError(f"schedule {name!r} is already declared")
        if (every is None) == (cron is None):
            raise ConfigError(f"schedule {name!r}: give every=SECONDS or cron='EXPR', one of them")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int | float)
                                  or not 1 <= every <= MAX_SECONDS):
            raise ConfigError(f"schedule {name!r}: every must be from 1 to {MAX_SECONDS:,} "
                              f"seconds, not {every!r}")
        _check(Job(kind, tenant, payload, queue, priority, None, None, max_attempts), None)
        schedule = Schedule(name, kind, tenant, float(every) if every is not None else None,
                            Cron.parse(cron) if cron is not None else None, payload, queue,
                            priority, max_attempts)
        self._by_name[name] = schedule
        return schedule

    def __iter__(self) -> Iterator[Schedule]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"Schedules({', '.join(self._by_name)})"


#: The default registry: ``from jobqueue import schedules`` then ``schedules.add``.
schedules = Schedules()


#: The worker re-reads the server's clock at least this often (seconds), whatever is due.
CLOCK_SYNC = 60.0
#: A schedule whose statement failed (not for its own data) is tried again after this long.
RETRY_AFTER = 1.0


@dataclass
class Periodic:
    """Enqueue the schedules' slots as they come, on a worker's connection (``tick``).

    Slots come from the server's clock, never this host's: a host an hour fast would enqueue
    slots an hour early, and record a slot that the other workers' correct clocks then reach
    only an hour later. This host's clock only says when to look again (it is read with the
    offset to the server's, re-measured every ``CLOCK_SYNC`` seconds and whenever a slot may
    have come), and ``periodic_enqueue`` refuses a slot the server's clock has not reached.
    """

    schedules: Schedules
    clock: Callable[[], float] = time.time
    #: Reads the server's clock (epoch seconds) on the worker's connection.
    server_clock: Callable[[psycopg.Connection], float] = field(
        default_factory=lambda: server_clock)
    _due: dict[str, float] = field(default_factory=dict)
    #: The server's clock minus this host's (seconds); None until first read.
    _offset: float | None = None
    _synced: float = -math.inf  # time.monotonic() of the last read
    #: Schedules skipped for this worker's life: their job can never be stored (a tenant of
    #: the wrong type, say); each was logged at ERROR once.
    skipped: set[str] = field(default_factory=set)

    def skip(self, name: str, why: str) -> None:
        """Never enqueue schedule `name` again in this worker; say so once, at ERROR."""
        if name not in self.skipped:
            self.skipped.add(name)
            log.error("periodic %s: skipped (%s): fix the schedule; the worker runs the rest",
                      name, why)
        self._due[name] = math.inf

    def tick(self, conn: psycopg.Connection) -> list[int]:
        """Enqueue each schedule whose slot has come; return the ids of the jobs enqueued.

        Cheap when nothing is due: one clock reading and a comparison per schedule (and the
        server's clock once a minute).
        """
        local = self.clock()
        if (self._offset is not None and time.monotonic() - self._synced < CLOCK_SYNC
                and all(local + self._offset < self._due.get(s.name, -math.inf)
                        for s in self.schedules)):
            return []
        now = self.server_clock(conn)
        self._offset, self._synced = now - local, time.monotonic()
        ids: list[int] = []
        for s in self.schedules:
            if now < self._due.get(s.name, -math.inf):
                continue
            at = datetime.fromtimestamp(now, UTC)
            slot = s.slot_at(at)
            if slot is not None:
                try:
                    row = conn.execute(q("periodic_enqueue"), s.params(slot)).fetchone()
                except (psycopg.errors.DataError, psycopg.errors.CheckViolation) as e:
                    # The schedule's own data (its tenant not of the installed type, say): it
                    # will never work. Skipped, not a reason to stop running every other job.
                    self.skip(s.name, " ".join(str(e).split()))
                    continue
                except psycopg.Error:
                    self._due[s.name] = now + RETRY_AFTER  # not every round: once a second
                    raise
                if row is not None and row[0] is not None:
                    ids.append(int(row[0]))
                    log.info("periodic %s: enqueued job %s for %s", s.name, row[0],
                             slot.isoformat())
            nxt = s.next_after(at)
            self._due[s.name] = nxt.timestamp() if nxt is not None else math.inf
        return ids


def server_clock(conn: psycopg.Connection) -> float:
    """Return the server's clock, in epoch seconds (what decides the slots)."""
    row = conn.execute(q("periodic_server_clock")).fetchone()
    assert row is not None
    return float(row[0])


def bad_schedules(conn: psycopg.Connection, schedules: Schedules) -> dict[str, str]:
    """Return the schedules whose job the database would refuse, by name, with why.

    Run by a worker's preflight: a tenant id that is not of the installed tenant type
    (``'acme'`` on a bigint install) can be known only there.
    """
    bad: dict[str, str] = {}
    for s in schedules:
        try:
            conn.execute(q("tenant_cast"), {"tenant": str(s.tenant)})
        except psycopg.errors.DataError as e:
            bad[s.name] = f"its tenant {s.tenant!r} is not a tenant id here: " + \
                " ".join(str(e).split())
    return bad
