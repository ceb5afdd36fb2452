"""The worker processes of finding ``pgbouncer``: each one a client of the pooler.

``python -m tenantlab.experiments._pooled ROLE ...`` with the DSN in ``TENANTLAB_DSN``:

- ``tenant``: jobs that each set one of its tenants (``--form session|local``) and count the
  invoices they see, until told to stop (SIGTERM);
- ``reader``: ``--reads`` transactions that set no tenant and record what their server
  connection carries (a tenant, invoices);
- ``leased``: the corrected worker (``queue.Leased``) on a connection without automatic
  prepared statements, until the queue is empty.

Every step is one line of the shared event log, with the server connection (backend pid) it ran
on: the experiment draws who got which server connection from it. ``clients(dsn, log)`` is the
experiment's side: it starts them and always ends them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from .. import db, queue, settings, tenant
from ..events import EventLog
from ..queries import q
from ._procs import end


class _Stop:
    def __init__(self) -> None:
        self.asked = False
        signal.signal(signal.SIGTERM, self.ask)
        signal.signal(signal.SIGINT, self.ask)

    def ask(self, signum: int, frame: object) -> None:
        self.asked = True


def _connect(name: str) -> psycopg.Connection:
    # prepare_threshold=None: no automatic prepared statements, which PgBouncer's transaction
    # mode (before 1.21) cannot follow from one server connection to the next.
    return db.connect(settings.dsn() or "", name, autocommit=True, prepare_threshold=None)


def tenant_jobs(name: str, events: EventLog, tenants: list[int], form: str, interval: float) -> None:
    """Run one job per tenant in turn, round and round, until stopped."""
    stop = _Stop()
    with _connect(name) as conn:
        n = 0
        while not stop.asked:
            t = tenants[n % len(tenants)]
            n += 1
            with conn.transaction():
                tenant.set_tenant(conn, t, local=form == "local")
                seen = tenant.count_invoices(conn)
                server = db.scalar(conn, q("pgbouncer_server"))
            events.emit("job", n=n, tenant=t, form=form, invoices=seen, server=server)
            time.sleep(interval)


def reads(name: str, events: EventLog, count: int, interval: float) -> None:
    """Read `count` times without setting a tenant; record what each read saw."""
    stop = _Stop()
    with _connect(name) as conn:
        for n in range(1, count + 1):
            if stop.asked:
                break
            with conn.transaction():
                seen, invoices, server = conn.execute(q("pgbouncer_read")).fetchone() or ("", 0, 0)
            events.emit("read", n=n, tenant=int(seen) if seen else None, invoices=invoices,
                        server=server)
            time.sleep(interval)


def leased(name: str, events: EventLog) -> None:
    """Run the corrected worker until the queue is empty."""
    stop = _Stop()
    design = queue.Leased(lease=30.0, backoff=0.0)
    with _connect(name) as conn:
        while not stop.asked:
            if design.run_one(conn, worker=name, events=events) is None:
                break


# --- the experiment's side: start them, wait for them, always end them ----------------------

class Clients:
    """Child processes that are clients of the pooler (or of the server); always ended."""

    def __init__(self, dsn: str, path: Path) -> None:
        # The DSN (with its password) goes through the environment, not the command line.
        self.env = dict(os.environ, TENANTLAB_DSN=dsn)
        self.path = path
        self.procs: list[subprocess.Popen] = []

    def start(self, role: str, name: str, *options: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "tenantlab.experiments._pooled", role, "--name", name,
               "--events", str(self.path), *options]
        proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        """Ask every live process to stop, then kill what is left; raise on one that failed."""
        failed = [f"pid {p.pid} exited {p.returncode}: {err.strip()[-300:]}"
                  for p, err in end(self.procs) if p.returncode not in (0, -15)]
        self.procs = []
        if failed:
            raise RuntimeError(f"pgbouncer worker process failed: {failed[0]}")


@contextmanager
def clients(dsn: str, path: Path) -> Iterator[Clients]:
    c = Clients(dsn, path)
    try:
        yield c
    finally:
        c.close()


def wait(until: Callable[[], bool], timeout: float, tick: Callable[[], None] | None = None,
          procs: list[subprocess.Popen] | None = None) -> None:
    """Return when until() holds or a process failed (close() says why); tick() meanwhile."""
    deadline = time.monotonic() + timeout
    while not until():
        for p in procs or []:
            if p.poll() not in (None, 0):
                return  # Clients.close says why
        if time.monotonic() > deadline:
            raise TimeoutError(f"pgbouncer experiment step still not done after {timeout:g} s")
        if tick:
            tick()
        time.sleep(0.1)
    if tick:
        tick()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tenantlab.experiments._pooled")
    p.add_argument("role", choices=["tenant", "reader", "leased"])
    p.add_argument("--name", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--form", choices=["session", "local"], default="local")
    p.add_argument("--tenants", default="1")
    p.add_argument("--reads", type=int, default=100)
    p.add_argument("--interval", type=float, default=0.005)
    args = p.parse_args(argv)
    events = EventLog(args.name, args.events)
    events.emit("worker-start", role=args.role)
    try:
        if args.role == "tenant":
            tenant_jobs(args.name, events, [int(t) for t in args.tenants.split(",")], args.form,
                        args.interval)
        elif args.role == "reader":
            reads(args.name, events, args.reads, args.interval)
        else:
            leased(args.name, events)
    finally:
        events.emit("worker-stop")
        events.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
