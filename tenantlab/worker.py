"""Run a worker process: claim and run jobs with one design until told to stop.

``tenantlab worker --design single|leased`` runs this loop as the ordinary worker role. It
stops cleanly on SIGTERM/SIGINT after its current job (a second signal stops it at once),
after ``--max-jobs`` claims, or when the queue is empty (``--until-empty``). Every event goes
to an event log (stdout or a file, one JSON line each) that experiments draw timelines from.

Without ``--dsn`` (or ``TENANTLAB_DSN``) the worker, ``enqueue`` and ``reap`` share a
playground database, ``tenantlab_playground``, cloned from the template on first use.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import db, kinds, queries, queue, settings
from .events import EventLog
from .heartbeat import HeartbeatError

log = logging.getLogger("tenantlab")

PLAYGROUND = "tenantlab_playground"


def playground_dsn() -> str:
    """Return the playground database's admin DSN; clone it from the template if needed."""
    admin = db.admin_dsn()
    db.ensure_template(admin)
    with db.connect(admin, "playground", autocommit=True) as conn:
        current = db.schema_of(conn, PLAYGROUND)
        if current != queries.schema_version():
            if current is not None:
                log.warning("the schema changed: recreating %s (its jobs are gone)", PLAYGROUND)
            db.clone_template(conn, PLAYGROUND)
    return db.with_db(admin, PLAYGROUND)


def worker_dsn(dsn: str | None = None) -> str:
    """Return a DSN that logs in as the worker role: --dsn, TENANTLAB_DSN, or the playground.

    A DSN for another user (the admin's, say) keeps its host and database but switches to
    tenantlab_worker: workers never run as the owner or a superuser.
    """
    dsn = dsn or settings.dsn() or playground_dsn()
    if conninfo_to_dict(dsn).get("user") == db.WORKER:
        return dsn
    return make_conninfo(dsn, user=db.WORKER, password=db.worker_password(dsn))


@dataclass
class WorkerConfig:
    """What one worker process does; the CLI's options."""

    design: str = "leased"
    lease: float = 30.0
    backoff: float = 1.0
    handle_errors: bool = False
    max_jobs: int | None = None  # stop after this many claims
    until_empty: bool = False  # stop when a claim finds nothing
    poll: float = 0.5  # seconds between claims on an empty queue
    name: str | None = None
    heartbeat: float | None = None  # seconds between lease extensions (leased)
    max_runtime: float | None = None  # seconds after which the heartbeat abandons the job
    fence: bool = True  # False: finish without the attempt check (finding overrun only)

    def __post_init__(self) -> None:
        if self.design not in ("single", "leased"):
            raise queue.QueueError(f"design must be 'single' or 'leased', not {self.design!r}")
        if not self.lease > 0:
            raise queue.QueueError(f"lease must be a positive number of seconds, not {self.lease}")
        if self.backoff < 0:
            raise queue.QueueError(f"backoff must be 0 (off) or positive seconds, not {self.backoff}")
        if self.max_jobs is not None and self.max_jobs < 1:
            raise queue.QueueError(f"max-jobs must be at least 1, not {self.max_jobs}")
        if not self.poll > 0:
            raise queue.QueueError(f"poll must be a positive number of seconds, not {self.poll}")


class Worker:
    """Claim and run jobs in a loop; stop between jobs when asked."""

    def __init__(self, dsn: str, config: WorkerConfig, events: EventLog | None = None) -> None:
        self.dsn, self.config = dsn, config
        self.name = config.name or f"worker-{os.getpid()}"
        self.events = events or EventLog(self.name)
        self.design = queue.design(config.design, lease=config.lease, backoff=config.backoff,
                                   handle_errors=config.handle_errors, heartbeat=config.heartbeat,
                                   max_runtime=config.max_runtime, fence=config.fence)
        self.stopping = False
        self.claimed = 0

    def stop(self, signum: int | None = None, frame: object = None) -> None:
        """Finish the current job, then stop; a second call stops at once."""
        if self.stopping:
            raise KeyboardInterrupt
        self.stopping = True
        self.events.emit("stop-requested", signal=signum)

    def run(self) -> int:
        """Run until stopped; return how many jobs were claimed."""
        c = self.config
        self.events.emit("worker-start", design=c.design, lease=c.lease, backoff=c.backoff,
                         handle_errors=c.handle_errors, heartbeat=c.heartbeat,
                         max_runtime=c.max_runtime, fence=c.fence)
        idle = False
        try:
            with db.connect(self.dsn, self.name, autocommit=True) as conn:
                while not self.stopping:
                    outcome = self.design.run_one(conn, worker=self.name, events=self.events)
                    if outcome is None:
                        if c.until_empty:
                            break
                        if not idle:
                            self.events.emit("idle")
                            idle = True
                        self._sleep(c.poll)
                        continue
                    idle = False
                    self.claimed += 1
                    if c.max_jobs is not None and self.claimed >= c.max_jobs:
                        break
        finally:
            self.events.emit("worker-stop", claimed=self.claimed)
        return self.claimed

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.05, seconds))


def main(args: Any) -> int:
    """Run `tenantlab worker` with parsed arguments."""
    config = WorkerConfig(design=args.design, lease=args.lease, backoff=args.backoff,
                          handle_errors=args.handle_errors, max_jobs=args.max_jobs,
                          until_empty=args.until_empty, poll=args.poll, name=args.name,
                          heartbeat=args.heartbeat, max_runtime=args.max_runtime,
                          fence=not args.no_fence)
    name = config.name or f"worker-{os.getpid()}"
    try:
        queue.design(config.design, lease=config.lease, heartbeat=config.heartbeat,
                     max_runtime=config.max_runtime, fence=config.fence)
    except (queue.QueueError, HeartbeatError) as e:
        print(f"tenantlab worker: {e}", file=sys.stderr)
        return 2
    events = EventLog(name, args.events)
    worker = Worker(worker_dsn(args.dsn), config, events)
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    try:
        worker.run()
    finally:
        events.close()
    return 0


# --- starting workers as child processes (experiments, tests, notebooks) ---------------------

def command(*, design: str, name: str, events: str | Path, lease: float | None = None,
            backoff: float | None = None, handle_errors: bool = False,
            max_jobs: int | None = None, until_empty: bool = False,
            poll: float | None = None, heartbeat: float | None = None,
            max_runtime: float | None = None, fence: bool = True) -> list[str]:
    """Return the argv that starts one worker process."""
    argv = [sys.executable, "-m", "tenantlab", "worker", "--design", design, "--name", name,
            "--events", str(events)]
    for flag, value in (("--lease", lease), ("--backoff", backoff), ("--max-jobs", max_jobs),
                        ("--poll", poll), ("--heartbeat", heartbeat),
                        ("--max-runtime", max_runtime)):
        if value is not None:
            argv += [flag, str(value)]
    if handle_errors:
        argv.append("--handle-errors")
    if until_empty:
        argv.append("--until-empty")
    if not fence:
        argv.append("--no-fence")
    return argv


class Fleet:
    """Child worker processes that are always ended: ``with fleet() as f: f.start(...)``."""

    def __init__(self, dsn: str) -> None:
        # The DSN (with its password) goes through the environment, not the command line.
        self.env = dict(os.environ, TENANTLAB_DSN=dsn)
        self.procs: list[subprocess.Popen] = []

    def start(self, **options: Any) -> subprocess.Popen:
        proc = subprocess.Popen(command(**options), env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen, timeout: float = 60.0, tick: Any = None) -> int:
        """Wait for one worker to exit, calling tick() every 0.2 s (live charts)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired as e:
                if tick:
                    tick()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"worker pid {proc.pid} still running after {timeout} s") from e
        if tick:
            tick()
        return code

    def close(self) -> None:
        """Ask every live worker to stop, then kill what is left; read their stderr."""
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            p.terminate()
        for p in self.procs:
            try:
                _, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            if err and p.returncode not in (0, 1, -signal.SIGTERM):
                log.warning("worker pid %s exited %s: %s", p.pid, p.returncode, err[-500:])


@contextmanager
def fleet(dsn: str) -> Iterator[Fleet]:
    f = Fleet(dsn)
    try:
        yield f
    finally:
        f.close()


def _number(kind: type, what: str, *, zero: bool = False, unit: str = "") -> Any:
    whole = "whole " if kind is int else ""
    valid = f"{what} must be {'0 or ' if zero else ''}a positive {whole}number{unit}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{valid}, not {text!r}") from None
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"{valid}, not {text!r}")
        return value
    return parse


def _tenant(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"tenant must be a number from 1 to 100, not {text!r}")
    return value


def add_arguments(sub: Any) -> None:
    """Add the worker, enqueue and reap subcommands to the CLI's subparsers."""
    def seconds(what: str) -> Any:
        return _number(float, what, unit=" of seconds")

    def seconds_or_zero(what: str) -> Any:
        return _number(float, what, zero=True, unit=" of seconds")

    def count(what: str) -> Any:
        return _number(int, what)
    dsn_help = ("database to work on (default: TENANTLAB_DSN, else the playground database); "
                "always logs in as tenantlab_worker")

    w = sub.add_parser("worker", help="run a worker: claim and run jobs until stopped")
    w.add_argument("--design", choices=["single", "leased"], default="leased",
                   help="single: one transaction per job; leased: committed claim with a lease")
    w.add_argument("--lease", type=seconds("lease"), default=30.0, help="lease in seconds (leased)")
    w.add_argument("--backoff", type=seconds_or_zero("backoff"), default=1.0,
                   help="first retry delay in seconds, doubling per attempt; 0 = off (leased)")
    w.add_argument("--handle-errors", action="store_true",
                   help="single: count a failed attempt in a new transaction")
    w.add_argument("--heartbeat", type=seconds("heartbeat"), default=None,
                   help="extend the lease every S seconds while a job runs; S < lease (leased)")
    w.add_argument("--max-runtime", type=seconds("max-runtime"), default=None,
                   help="stop the heartbeat after S seconds: the job is abandoned (leased)")
    w.add_argument("--no-fence", action="store_true",
                   help="finish without checking the attempt: the naive lease-only queue (leased)")
    w.add_argument("--max-jobs", type=count("max-jobs"), default=None, help="stop after N claims")
    w.add_argument("--until-empty", action="store_true", help="stop when the queue is empty")
    w.add_argument("--poll", type=seconds("poll"), default=0.5, help="seconds between polls when idle")
    w.add_argument("--name", default=None, help="worker name in job_runs and the event log")
    w.add_argument("--events", default="-", help="event log file (default: stdout)")
    w.add_argument("--dsn", default=None, help=dsn_help)
    w.set_defaults(func=main)

    e = sub.add_parser("enqueue", help="queue jobs")
    e.add_argument("--kind", required=True, choices=list(kinds.KINDS), help="what the job does")
    e.add_argument("--tenant", type=_tenant, default=None,
                   help="tenant 1..100 (default: spread over all)")
    e.add_argument("--count", type=count("count"), default=1, help="how many jobs")
    e.add_argument("--seconds", type=seconds_or_zero("seconds"), default=0.0,
                   help="work duration (sleep, crash)")
    e.add_argument("--max-attempts", type=count("max-attempts"), default=3, help="attempts before dead")
    e.add_argument("--dsn", default=None, help=dsn_help)
    e.set_defaults(func=cmd_enqueue)

    r = sub.add_parser("reap", help="move exhausted jobs whose lease expired to dead")
    r.add_argument("--requeue", action="store_true",
                   help="also requeue expired jobs that have attempts left")
    r.add_argument("--grace", type=seconds_or_zero("grace"), default=0.0,
                   help="seconds past the lease before acting")
    r.add_argument("--loop", type=seconds("loop"), default=None,
                   help="keep reaping every S seconds until stopped")
    r.add_argument("--dsn", default=None, help=dsn_help)
    r.set_defaults(func=cmd_reap)


def cmd_enqueue(args: Any) -> int:
    with db.connect(worker_dsn(args.dsn), "enqueue", autocommit=True) as conn:
        ids = queue.enqueue(conn, args.kind, tenant=args.tenant, count=args.count,
                            seconds=args.seconds, max_attempts=args.max_attempts)
    span = f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"
    print(f"queued {len(ids)} {args.kind} job{'s' if len(ids) != 1 else ''}: id {span}")
    return 0


def cmd_reap(args: Any) -> int:
    from .reaper import Reaper, ReaperConfig

    config = ReaperConfig(grace=args.grace, requeue=args.requeue,
                          interval=args.loop or ReaperConfig.interval)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    with db.connect(worker_dsn(args.dsn), "reaper", autocommit=True) as conn:
        if args.loop is None:
            reaped = Reaper(conn, config).run_once()
            for job in reaped:
                print(f"job {job['id']}: {job['status']} (attempts {job['attempts']})")
            print(f"reaped {len(reaped)} job{'s' if len(reaped) != 1 else ''}")
            return 0
        try:
            Reaper(conn, config, EventLog("reaper")).run_forever(stop=lambda: bool(stopping))
        except KeyboardInterrupt:
            pass
    return 0
