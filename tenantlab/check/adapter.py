"""The one protocol a queue implements to be checked, and the registry of queues.

An adapter is one small module: ``tenantlab/check/queues/<name>.py`` for the queues the kit
knows, or a third party's class named by an entry point in the group ``tenantlab.queues``::

    [project.entry-points."tenantlab.queues"]
    myqueue = "myapp.tenantlab_adapter:MyQueue"

An adapter object is one row of the matrix: a queue with one setting (``default`` is the ★ row,
the library's true defaults; ``scaled`` the defaults with every timer that decides a takeover set
to the scenario's lease, alike for every queue, so a scenario sees the fault handled within
seconds; ``recommended`` what its docs recommend for reliability, each setting quoted).

An adapter may also say what its own settings promise (``policy(options) -> Policy``): how many
executions a job may get, after how long a job whose worker is gone may run again, and when a
failing or crashing job becomes final. The checkers judge a row against that, not against one
stopwatch for every row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal, Protocol, runtime_checkable

#: A job's state as the suite reads it, whatever the library calls it.
State = Literal["queued", "running", "done", "failed", "dead"]
TERMINAL: frozenset[str] = frozenset({"done", "failed", "dead"})
Setting = Literal["default", "scaled", "recommended"]
SETTINGS: tuple[str, ...] = ("default", "scaled", "recommended")
ENTRY_POINTS = "tenantlab.queues"


@dataclass
class Options:
    """What a scenario asks of a worker: the lease (or timeout) it sets where the library has
    one, attempts, concurrency; an adapter maps them to its own settings or ignores them."""

    lease: float = 2.0           # seconds a job may run before another worker may take it
    max_attempts: int = 3
    concurrency: int = 1         # jobs one worker process runs at once
    poll: float = 0.2            # seconds between polls, where a library polls
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Policy:
    """What a row's own settings promise, in seconds from a job's first start.

    ``budget``: the executions its settings allow one job (None: no budget, it may run for
    ever). ``timeout``: seconds a job may run without its worker's heartbeat (or past its lease)
    before another worker may run it (None: never taken over). ``poison_final`` /
    ``crash_final``: when its settings make a job that fails every attempt / kills its worker
    every attempt final (None: never). ``poll``: the longest an idle worker waits before it
    looks for a job (0: woken by a NOTIFY only). ``basis``: one sentence saying how the
    numbers follow from the settings. ``concurrency``: how many jobs one worker runs at once
    (printed beside throughput).
    """

    budget: int | None = 3
    timeout: float | None = None
    poison_final: float | None = None
    crash_final: float | None = None
    poll: float = 0.0
    basis: str = ""
    concurrency: str = "1 job at a time per worker"


def policy_of(adapter: Any, options: Options) -> Policy:
    """The adapter's policy, or the plain reading of the options when it says none."""
    fn = getattr(adapter, "policy", None)
    if fn is not None:
        return fn(options)
    return Policy(budget=options.max_attempts, timeout=options.lease, poll=options.poll,
                  basis="the adapter states no policy: the scenario's options")


@runtime_checkable
class Adapter(Protocol):
    """One queue × one setting.

    ``name``: the queue (``naive``, ``jobqueue``, ``procrastinate``, ``pgqueuer``, ``awa``, or a
    third party's); ``setting``: ``default``, ``scaled`` or ``recommended``; ``settings``: what
    this row sets, each ``{name: value}`` (a recommended one ``{"value": .., "source": {"url",
    "quote"}}``); ``links``: the page that recommends each setting (a URL per name in
    ``settings``); ``promises``: one sentence of what the library's docs promise about
    failures; ``install_hint``: how to install the library when ``version()`` is None;
    ``features``: what it supports beyond the basics (``"tenant-hook"``: a per-job connection
    hook, for the tenant-leak scenario; ``"attempts"``: the body sees an attempt number).
    """

    name: str
    setting: Setting
    settings: dict[str, Any]
    links: dict[str, str]
    promises: str
    install_hint: str
    features: frozenset[str]

    def version(self) -> str | None:
        """The library's installed version, or None when it is not installed."""

    def install(self, dsn: str) -> None:
        """Install the queue's schema in the (empty, throwaway) database ``dsn`` (an admin)."""

    def enqueue(self, dsn: str, kind: str, tenant: int, payload: dict[str, Any],
                options: Options) -> str:
        """Queue one job of a body ``kind`` (see ``bodies.KINDS``); return its id as text."""

    def worker_command(self, dsn: str, history: str, options: Options) -> list[str]:
        """The argv of ONE worker process that runs the suite's bodies, appending to ``history``
        (the suite starts, kills, freezes and restarts these processes)."""

    def maintenance_command(self, dsn: str, options: Options) -> list[str] | None:
        """The argv of a maintenance process the setting needs (a reaper, a stalled-jobs
        sweep), or None."""

    def states(self, dsn: str) -> dict[str, State]:
        """Every job's state by id, mapped to queued / running / done / failed / dead."""

    # Optional: ``policy(options) -> Policy`` (what its settings promise), ``created(dsn) ->
    # {id: epoch seconds}`` (each job's insert on the server's clock, for ``wake``).


def _builtin() -> dict[str, str]:
    return {name: f"tenantlab.check.queues.{name}"
            for name in ("naive", "jobqueue", "procrastinate", "pgqueuer", "awa")}


def rows(names: list[str] | None = None) -> Iterator[Adapter]:
    """Yield the adapters (each queue's default row, its scaled one, its recommended one), built-in
    queues first, then those of installed entry points; ``names`` picks queues."""
    import importlib

    for name, module in _builtin().items():
        if names and name not in names:
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue  # an adapter this checkout does not have (yet)
        yield from mod.rows()
    for ep in metadata.entry_points(group=ENTRY_POINTS):
        if names and ep.name not in names:
            continue
        obj = ep.load()
        made = obj() if isinstance(obj, type) else obj
        yield from (made if isinstance(made, list | tuple) else [made])
