"""Map job kinds to the application's functions: ``@handlers.register("email")``.

A handler is called as ``handler(conn, job)``: ``conn`` is inside the job's transaction with
the tenant already set (locally), ``job`` is the ``Claim`` (id, tenant_id, attempt, kind,
payload). Whatever it writes through ``conn`` commits with the job's completion, or not at all.
Its return value is the outcome's ``result``; an exception fails the attempt (counted).
``register(kind, max_runtime=S)`` gives the kind a maximum runtime of its own instead of the
worker's ``--max-runtime`` (it needs the heartbeat, which is on by default).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psycopg

from .jobs import Claim, UnknownKind

Handler = Callable[[psycopg.Connection, Claim], Any]


class Handlers(Mapping[str, Handler]):
    """A registry of handlers by kind; also accepts a plain mapping: ``Handlers({"k": fn})``."""

    def __init__(self, handlers: Mapping[str, Handler] | None = None) -> None:
        self._by_kind: dict[str, Handler] = {}
        self._max_runtime: dict[str, float] = {}
        for kind, fn in (handlers or {}).items():
            self.add(kind, fn)

    def add(self, kind: str, fn: Handler) -> None:
        """Register `fn` for jobs of `kind`; a kind has one handler."""
        if not kind or not isinstance(kind, str):
            raise ValueError(f"a job kind must be a non-empty string, not {kind!r}")
        if kind in self._by_kind and self._by_kind[kind] is not fn:
            raise ValueError(f"job kind {kind!r} already has a handler: "
                             f"{getattr(self._by_kind[kind], '__qualname__', '?')}")
        self._by_kind[kind] = fn

    def register(self, kind: str, *,
                 max_runtime: float | None = None) -> Callable[[Handler], Handler]:
        """Register the decorated function for jobs of `kind`; `max_runtime`: seconds after
        which its jobs are failed (the watchdog), instead of the worker's limit."""
        if max_runtime is not None and not 0 < max_runtime < float("inf"):
            raise ValueError(f"max_runtime must be a positive number of seconds, not "
                             f"{max_runtime!r}")

        def decorate(fn: Handler) -> Handler:
            self.add(kind, fn)
            if max_runtime is not None:
                self._max_runtime[kind] = float(max_runtime)
            return fn
        return decorate

    def max_runtime(self, kind: str) -> float | None:
        """Return the kind's own maximum runtime (None: the worker's)."""
        return self._max_runtime.get(kind)

    def lookup(self, job: Claim) -> Handler:
        """Return the handler of the job's kind; an unknown kind is an error that names the known."""
        try:
            return self._by_kind[job.kind]
        except KeyError:
            known = ", ".join(sorted(self._by_kind)) or "none registered"
            raise UnknownKind(f"job {job.id} has kind {job.kind!r}, which has no handler in this "
                              f"worker; known: {known}") from None

    def run(self, conn: psycopg.Connection, job: Claim) -> Any:
        """Run the job's handler."""
        return self.lookup(job)(conn, job)

    def __getitem__(self, kind: str) -> Handler:
        return self._by_kind[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_kind)

    def __len__(self) -> int:
        return len(self._by_kind)

    def __repr__(self) -> str:
        return f"Handlers({', '.join(self._by_kind)})"


#: The default registry: ``from jobqueue import handlers`` then ``@handlers.register``.
handlers = Handlers()
