"""What the three peer adapters (procrastinate, PgQueuer, awa) share: the row, the command line
of their worker processes, and a DSN the drivers that only read URLs understand.

Each peer module is importable without its library (the library is imported inside the
functions that use it), so a queue that is not installed is still a row: its ``version()`` is
None and its ``install_hint`` says how to get it.

A worker process is ``python -m tenantlab.check.queues.<name> worker --dsn .. --history ..
--setting .. --lease .. --max-attempts ..``: it defines the library's app and one task that
calls ``bodies.run_async`` with the job's id, attempt, tenant and payload, then runs the
library's own worker until it is stopped. The attempt the body records is 1 for a job's first
execution, counted by the library (``attempts + 1`` for the libraries that count previous
attempts); a re-run the library does not count keeps its number.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any
from urllib.parse import quote, urlencode

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..adapter import Options, Setting

EXTRA = "check"  # the kit's optional extra that pins the peers' versions


#: The suite's longest job (the overrun job, 2.5 leases of 2 s): the recommended rows size the
#: timers their docs tie to "the longest job plus a margin" from it.
LONGEST_JOB = 5.0
MARGIN = 3.0


def quoted(value: Any, url: str, quote: str) -> dict[str, Any]:
    """A recommended setting with where its docs say so: ``{"value", "source": {"url",
    "quote"}}`` (the quote verbatim from the page)."""
    return {"value": value, "source": {"url": url, "quote": quote}}


def install_hint(*requirements: str) -> str:
    """Say how to install a peer: the kit's extra, or the library on its own."""
    return f"pip install 'tenantlab[{EXTRA}]'  (or: pip install {' '.join(requirements)})"


@dataclass
class Peer:
    """One peer queue × one setting; subclasses add install / enqueue / states."""

    name: str
    setting: Setting
    settings: dict[str, Any]
    links: dict[str, str]
    promises: str
    install_hint: str
    distribution: str = ""
    features: frozenset[str] = field(default_factory=lambda: frozenset({"attempts", "event-loop"}))

    def version(self) -> str | None:
        """The installed version of the library, None when it is not installed."""
        try:
            return metadata.version(self.distribution or self.name)
        except metadata.PackageNotFoundError:
            return None

    def command(self, role: str, dsn: str, options: Options) -> list[str]:
        """The argv of one of this row's processes (``worker`` or ``maintenance``)."""
        return [sys.executable, "-m", f"tenantlab.check.queues.{self.name}", role,
                "--dsn", dsn, "--setting", self.setting, "--lease", str(options.lease),
                "--max-attempts", str(options.max_attempts),
                "--concurrency", str(options.concurrency), "--poll", str(options.poll),
                *(["--retry", str(options.extra["retry"])] if "retry" in options.extra else []),
                *(["--pooler"] if options.extra.get("pooler") else [])]

    def worker_command(self, dsn: str, history: str, options: Options) -> list[str]:
        return [*self.command("worker", dsn, options), "--history", history]

    def maintenance_command(self, dsn: str, options: Options) -> list[str] | None:
        return None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Read a peer process's command line (see ``Peer.command``)."""
    p = argparse.ArgumentParser(description="one worker (or maintenance) process of a peer queue")
    p.add_argument("role", choices=("worker", "maintenance"))
    p.add_argument("--dsn", required=True)
    p.add_argument("--history", default="")
    p.add_argument("--setting", choices=("default", "scaled", "recommended"), default="default")
    p.add_argument("--lease", type=float, default=Options.lease)
    p.add_argument("--max-attempts", type=int, default=Options.max_attempts)
    p.add_argument("--concurrency", type=int, default=Options.concurrency)
    p.add_argument("--poll", type=float, default=Options.poll)
    p.add_argument("--retry", default=None, help="procrastinate only: the task's retry value")
    p.add_argument("--pooler", action="store_true",
                   help="the DSN leads to PgBouncer in transaction mode: the driver settings "
                        "its docs give for a pooler")
    args = p.parse_args(argv)
    if args.role == "worker" and not args.history:
        p.error("a worker needs --history")
    # The libraries log each failed job with a traceback: a poison loop would fill a pipe the
    # suite does not read, and block the worker. The history holds every error anyway.
    logging.basicConfig(level=logging.CRITICAL, stream=sys.stderr)
    return args


def tagged(dsn: str, name: str) -> str:
    """The DSN with application_name 'tenantlab <name>': 'check <queue> worker' for the peers'
    processes, 'suite <queue> <what>' for the suite's own calls (install, enqueue, states),
    which the scenario ``terminate`` leaves alone."""
    return make_conninfo(dsn, application_name=f"tenantlab {name}")


def url(dsn: str, name: str | None = None) -> str:
    """The DSN as a postgresql:// URL (asyncpg and awa's sqlx read only URLs)."""
    p = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    if name:
        p["application_name"] = f"tenantlab {name}"
    user = quote(p.pop("user", ""), safe="")
    password = p.pop("password", None)
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    host = p.pop("host", "")
    netloc = "" if host.startswith("/") else quote(host, safe="")
    if host.startswith("/"):
        p["host"] = host
    port = p.pop("port", "")
    dbname = quote(p.pop("dbname", ""), safe="")
    query = f"?{urlencode(p)}" if p else ""
    return f"postgresql://{auth}{netloc}{':' + port if port else ''}/{dbname}{query}"


def run[T](make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion, also from a thread whose event loop is running (a
    notebook's kernel): then on a loop of its own in another thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    out: list[T] = []
    err: list[BaseException] = []

    def target() -> None:
        try:
            out.append(asyncio.run(make()))
        except BaseException as e:  # handed back to the caller's thread
            err.append(e)

    t = threading.Thread(target=target, name="tenantlab-peer")
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def three_rows(base: dict[str, Any], scaled: dict[str, Any],
              recommended: dict[str, Any]) -> list[tuple[Setting, dict[str, Any]]]:
    """The three rows of a peer: ★, scaled, recommended, each with its settings."""
    return [("default", base), ("scaled", scaled), ("recommended", recommended)]
