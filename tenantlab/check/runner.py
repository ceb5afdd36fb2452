"""Run one scenario on one queue: a throwaway database, worker subprocesses, the faults, a Trial.

Every trial gets a database of its own (a clone of the kit's template, as admin: the peers'
schemas need it); the scenario ``restart`` gets a throwaway cluster of its own too, so the lab's
server is never restarted. Workers are subprocesses from ``adapter.worker_command`` (each in a
session of its own: a Ctrl-C in the terminal does not reach them, the suite ends them); faults
hit only them. Whatever happens, also on Ctrl-C, the workers and the maintenance process are
ended, the pooler and the cluster stopped and the database dropped before ``run`` returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from .. import db, queries
from ..server import Server, free_port, home
from . import history
from .adapter import TERMINAL, Adapter, Options, Policy, policy_of
from .checks import Fault, Job, Trial

log = logging.getLogger("tenantlab")

#: application_name of the suite's own sessions: never terminated by the scenario ``terminate``
#: (the peers' workers are named "tenantlab check ...": they are terminated).
SUITE = "tenantlab suite"
STEP = 0.1  # seconds between looks at the history, the states and the workers


_names = itertools.count(1)


class SuiteError(Exception):
    """The suite itself failed (a worker that cannot start, a database that cannot be made)."""


def _env() -> dict[str, str]:
    # Workers import this very package (the checkout, not an installed copy).
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@dataclass
class Process:
    """One subprocess of the suite, with its own log file."""

    proc: subprocess.Popen
    log: Path
    role: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def last_line(self) -> str:
        """The error it died of: the last line naming an exception, else its last line."""
        try:
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()
                     if ln.strip()]
        except OSError:
            return ""
        named = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Exit)\b", ln)]
        return (named or lines or [""])[-1][:200]


def spawn(argv: list[str], directory: Path, role: str) -> Process:
    """Start ``argv`` in a session of its own, its output in a log file."""
    path = directory / f"{role}-{time.monotonic_ns()}.log"
    with open(path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=_env(), start_new_session=True)
    return Process(proc, path, role)


def end(p: Process, grace: float = 2.0) -> None:
    """End a process and everything it started: SIGCONT (it may be frozen), SIGTERM, SIGKILL."""
    if p.proc.poll() is not None:
        return
    for sig in (signal.SIGCONT, signal.SIGTERM):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, sig)
    try:
        p.proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.proc.wait()
    # Whatever the worker started itself (a pool of child processes) goes with its group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)


def children(pid: int | None = None) -> list[int]:
    """Return the live processes whose parent is ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


@dataclass
class Workers:
    """The worker processes of one trial; with ``restart`` a worker that ends is replaced."""

    argv: list[str]
    directory: Path
    trial: Trial
    restart: bool = False
    procs: dict[int, Process] = field(default_factory=dict)
    killed: set[int] = field(default_factory=set)

    def start(self, n: int = 1) -> None:
        for _ in range(n):
            p = spawn(self.argv, self.directory, "worker")
            self.procs[p.pid] = p

    def pids(self) -> list[int]:
        return [pid for pid, p in self.procs.items() if p.proc.poll() is None]

    def poll(self) -> None:
        """Note workers that ended; restart them when the scenario says so."""
        for pid, p in list(self.procs.items()):
            rc = p.proc.poll()
            if rc is None:
                continue
            del self.procs[pid]
            now = time.time()
            if pid not in self.killed:
                self.trial.exits[pid] = (now, rc, p.last_line() if rc not in (0, -9) else "")
            if self.restart:
                self.start()
                self.trial.faults.append(Fault(now, "restart-worker", pid))

    def signal(self, pid: int, sig: signal.Signals, action: str) -> None:
        self.trial.faults.append(Fault(time.time(), action, pid))
        if sig == signal.SIGKILL:
            self.killed.add(pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)

    def close(self) -> None:
        for p in self.procs.values():
            end(p)
        self.procs.clear()


class Context:
    """What a scenario's script may do: enqueue, wait, look, and apply faults."""

    def __init__(self, adapter: Adapter, dsn: str, trial: Trial, options: Options,
                 workers: Workers, history_path: Path, cluster: Cluster | None) -> None:
        self.adapter, self.dsn, self.trial, self.options = adapter, dsn, trial, options
        self.workers, self.history_path, self.cluster = workers, history_path, cluster
        self.states: dict[str, str] = {}

    # --- the queue --------------------------------------------------------------------------

    def enqueue(self, kind: str, tenant: int = 1, **payload: Any) -> Job:
        requested = time.time()
        job_id = self.adapter.enqueue(self.dsn, kind, tenant, payload, self.options)
        job = Job(str(job_id), kind, tenant, payload, time.time(), requested)
        if not self.trial.jobs:
            self.trial.t0 = job.enqueued
        self.trial.jobs.append(job)
        return job

    def executions(self) -> list[history.Execution]:
        return history.read(self.history_path)

    def look(self) -> None:
        """Restart ended workers (if asked) and snapshot the queue's states."""
        self.workers.poll()
        try:
            self.states = {str(k): v for k, v in self.adapter.states(self.dsn).items()}
        except Exception as e:  # a restarting or terminated server (any driver's error): later
            log.debug("states not read: %s", e)
            return
        self.trial.snapshots.append((time.time(), dict(self.states)))

    def wait(self, seconds: float, until: Callable[[], bool] | None = None) -> bool:
        """Look every STEP for up to ``seconds``; return True as soon as ``until()`` holds."""
        deadline = time.monotonic() + seconds
        while True:
            self.look()
            if until is not None and until():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(STEP)

    def terminal(self) -> bool:
        return bool(self.trial.jobs) and all(self.states.get(j.id) in TERMINAL
                                             for j in self.trial.jobs)

    # --- faults -----------------------------------------------------------------------------

    def freeze(self, pid: int) -> None:
        self.workers.signal(pid, signal.SIGSTOP, "stop")

    def thaw(self, pid: int) -> None:
        self.workers.signal(pid, signal.SIGCONT, "cont")

    def restart_server(self) -> None:
        if self.cluster is None:
            raise SuiteError("restart needs the throwaway cluster")
        self.trial.faults.append(Fault(time.time(), "restart", None, "pg_ctl restart -m immediate"))
        self.cluster.restart_immediate()

    def terminate_sessions(self) -> list[int]:
        """pg_terminate_backend on every session of the trial's database but the suite's."""
        with db.connect(self.dsn, "suite", autocommit=True) as conn:
            rows = conn.execute(
                "select pid, pg_terminate_backend(pid) from pg_stat_activity "
                "where datname = current_database() and pid <> pg_backend_pid() "
                "and backend_type = 'client backend' "
                "and coalesce(application_name, '') not like %s", (SUITE + "%",)).fetchall()
        pids = [r[0] for r in rows if r[1]]
        now = time.time()
        self.trial.faults += [Fault(now, "terminate", pid, "backend pid") for pid in pids]
        if not pids:
            self.trial.faults.append(Fault(now, "terminate", None, "no session found"))
        return pids


class Cluster:
    """A throwaway PostgreSQL cluster (data kept under TENANTLAB_HOME between runs), for
    ``restart``: the lab's own server is never restarted."""

    def __init__(self) -> None:
        self.server = Server(home() / "check-cluster")

    def __enter__(self) -> Cluster:
        self.server.up(port=free_port())
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.down()

    def dsn(self) -> str:
        return self.server.dsn()

    def restart_immediate(self) -> None:
        s = self.server
        user = s._user()
        pg_ctl = s._bindir_for(user) / "pg_ctl"
        done = s._run([str(pg_ctl), "restart", "-m", "immediate", "-w", "-t", "60",
                       "-D", str(s.data), "-l", str(s.logfile)], user, check=False)
        if done.returncode != 0:
            raise SuiteError(f"the throwaway cluster did not restart: {s._last_log_line()}")


def _name(label: str) -> str:
    safe = "".join(c if c.isalnum() else "_" for c in label.lower())[:24]
    return f"tenantlab_check_{safe}_{os.getpid()}_{next(_names)}"


@contextlib.contextmanager
def database(admin: str, template: str, label: str) -> Iterator[db.Scratch]:
    """A database cloned from ``template`` (the kit's, or one a queue was installed in), as
    ``db.scratch`` makes them; dropped afterwards, its sessions ended."""
    name = _name(label)
    with db.connect(admin, "suite", autocommit=True) as conn:
        create = sql.SQL("create database {} template {} owner {}").format(
            sql.Identifier(name), sql.Identifier(template), sql.Identifier(db.OWNER))
        for attempt in range(50):
            try:
                conn.execute(create)
                break
            except psycopg.errors.ObjectInUse:
                # A library's pool closed a moment ago: its backends are still exiting.
                if attempt == 49:
                    raise
                time.sleep(0.1)
        db._set_search_path(conn, name)
        db._stamp(conn, name, queries.schema_version())  # `tenantlab uninstall` finds it
    worker = make_conninfo(admin, dbname=name, user=db.WORKER, password=db.worker_password(admin))
    try:
        yield db.Scratch(name=name, admin=db.with_db(admin, name), worker=worker)
    finally:
        with db.connect(admin, "suite", autocommit=True) as conn:
            db._drop(conn, name)


@contextlib.contextmanager
def installed(adapter: Adapter, dsn: str | None = None) -> Iterator[str]:
    """A template database with ``adapter``'s schema installed once, for every trial of a row
    (awa's migrations take seconds); dropped afterwards."""
    admin = dsn or db.admin_dsn()
    db.ensure_template(admin)
    with database(admin, db.TEMPLATE, f"tpl_{adapter.name}") as tpl:
        adapter.install(tpl.admin)
        yield tpl.name


@contextlib.contextmanager
def _pooler(admin: str, on: bool) -> Iterator[Any]:
    if not on:
        yield None
        return
    from .. import pgbouncer

    with pgbouncer.running(admin) as bouncer:
        yield bouncer


def run(adapter: Adapter, scenario: Any, *, options: Options | None = None,
        dsn: str | None = None, template: str | None = None) -> Trial:
    """Run ``scenario`` once on ``adapter``; return what was seen (``error`` set when the
    suite itself failed). Everything it started is ended before it returns.

    ``template``: a database ``installed`` made for this adapter on the same server (not used
    for a scenario on a cluster of its own)."""
    options = options or Options()
    if scenario.pooler:
        # The row's driver settings for a pooler (its docs'), on the workers' command line.
        options = dataclasses.replace(options, extra={**options.extra, "pooler": True})
    policy = policy_of(adapter, options)
    trial = Trial(scenario.id, bound(scenario, policy), time.time(), time.time(),
                  max_attempts=options.max_attempts, lease=options.lease, policy=policy,
                  cap=scenario.bound)
    try:
        with contextlib.ExitStack() as stack:
            admin = dsn or db.admin_dsn()
            cluster = stack.enter_context(Cluster()) if scenario.cluster else None
            if cluster is not None:
                admin = cluster.dsn()
            if template is not None and cluster is None:
                scratch = stack.enter_context(database(admin, template, scenario.id))
            else:
                db.ensure_template(admin)
                scratch = stack.enter_context(database(admin, db.TEMPLATE, scenario.id))
                adapter.install(scratch.admin)
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tenantlab-check-")))
            os.chmod(tmp, 0o777)
            history_path = tmp / "history.jsonl"
            bouncer = stack.enter_context(_pooler(admin, scenario.pooler))
            if bouncer is not None:
                with contextlib.suppress(Exception):  # the notes only; the run goes on
                    seen = bouncer.settings()
                    trial.notes["pgbouncer"] = {k: seen.get(k) for k in (
                        "version", "pool_mode", "default_pool_size", "max_prepared_statements")}
            worker_dsn = bouncer.through(scratch.admin) if bouncer is not None else scratch.admin
            workers = Workers(adapter.worker_command(worker_dsn, str(history_path), options), tmp,
                              trial, restart=scenario.restart)
            stack.callback(workers.close)
            if (argv := adapter.maintenance_command(scratch.admin, options)) is not None:
                keeper = spawn(argv, tmp, "maintenance")
                stack.callback(end, keeper)
            ctx = Context(adapter, scratch.admin, trial, options, workers, history_path, cluster)
            if scenario.queue_first:
                scenario.script(ctx)
            workers.start(scenario.workers)
            if not scenario.queue_first:
                scenario.script(ctx)
            _settle(ctx)
            trial.end = time.time()
            if scenario.id == "wake" and hasattr(adapter, "created"):
                with contextlib.suppress(psycopg.Error):
                    trial.notes["created"] = adapter.created(scratch.admin)
            trial.executions = ctx.executions()
            try:
                trial.states = {str(k): v for k, v in adapter.states(scratch.admin).items()}
            except psycopg.Error:
                trial.states = dict(ctx.states)
    except Exception as e:  # the suite's failure, or an adapter's: the run is not judged
        trial.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        trial.end = time.time()
    return trial


def bound(scenario: Any, policy: Policy) -> float:
    """The seconds a trial is watched: the scenario's cap, or less when the row's own settings
    make its job final sooner (then that time with a margin: 15 %, and 5 s for workers to
    start and polls to come round)."""
    final = {"poison": policy.poison_final, "crash": policy.crash_final}.get(scenario.id)
    if final is None:
        return float(scenario.bound)
    return min(float(scenario.bound), 1.15 * final + 5.0)


def _looping(ctx: Context) -> bool:
    """A poison or crash job already past its budget by more than two executions (or run five
    times without a budget): the verdict is known, more looping adds nothing."""
    trial = ctx.trial
    if trial.scenario not in ("poison", "crash"):
        return False
    budget = trial.policy.budget
    limit = (budget + 2) if budget is not None else 5
    counts = history.by_job(ctx.executions())
    return any(len(counts.get(j.id, [])) > limit for j in trial.jobs if j.kind == trial.scenario)


def _nothing_before_the_cap(ctx: Context) -> bool:
    """A crash job whose every execution has died, the jobs beside it final, and the row's own
    timeout putting its next run past the cap: by its settings nothing more happens in this
    trial (the verdict is read now; the witness says when its settings would act)."""
    trial = ctx.trial
    if trial.scenario != "crash":
        return False
    crash = {j.id for j in trial.jobs if j.kind == "crash"}
    if any(ctx.states.get(j.id) not in TERMINAL for j in trial.jobs if j.id not in crash):
        return False
    runs = [e for e in ctx.executions() if e.job in crash]
    alive = set(ctx.workers.pids())
    if not runs or any(e.end is None and e.pid in alive for e in runs):
        return False
    timeout = trial.policy.timeout
    return timeout is None or max(e.start for e in runs) + timeout > trial.t0 + trial.bound


def _settle(ctx: Context) -> None:
    """Wait until every job is final and no body is still running, or the bound has passed (or
    a safety job is already looping past its budget)."""
    trial = ctx.trial
    if not trial.jobs:
        return

    def quiet() -> bool:
        if _looping(ctx) or _nothing_before_the_cap(ctx):
            return True
        if not ctx.terminal():
            return False
        alive = set(ctx.workers.pids())
        return not any(e.end is None and e.pid in alive for e in ctx.executions())

    left = trial.t0 + trial.bound - time.time()
    if left > 0:
        ctx.wait(left, until=quiet)
