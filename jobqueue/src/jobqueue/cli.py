"""The command line: ``jobqueue [worker|reap|prune|migrate|OPS] --dsn DSN``.

``worker`` (the default) runs jobs with the handlers an application registered
(``--handlers myapp.jobs`` imports that module first); ``reap`` gives expired leases a final
state, once or ``--loop S``; ``prune --older-than S`` deletes finished jobs in batches;
``migrate`` (alias ``schema``) applies the queue's migrations, as the role that owns the schema.
The operator's commands (ops.py): ``stats``, ``jobs [--status S] [--kind K] [--tenant T]``,
``show ID``, ``retry ID`` / ``retry --dead [--kind K]``, ``cancel ID``; ``--json`` on each.
Logs: failures at WARNING with their traceback, dead jobs at ERROR; ``-v`` adds a line per
job; ``--log-format json`` writes one JSON object per line (logs.py).
``migrate`` (alias ``schema``) applies the queue's migrations, as the role that owns the schema;
``enqueue KIND --tenant T`` queues one job and prints its id.
The DSN may come from ``JOBQUEUE_DSN`` instead of the command line (where ``ps`` would show its
password).

Exit statuses: 0 stopped; 1 crashed (a bug: traceback); 2 bad configuration, one line on stderr
(a malformed DSN, a failed login, a missing database, a server not reachable at start, the
schema missing or behind, a missing grant, a handlers module that fails to import, no handlers);
3 lost the server for longer than ``--max-outage`` (a server that was reachable and went away:
the worker reconnects until then; one that then refuses the login or has lost the database
is 2); 4 stuck (a handler still ran a lease after its maximum runtime: restart it); 130
stopped at once by a second signal.
Signals: the first SIGTERM (or SIGINT) stops a worker after its current job or batch; a second
one stops it at once (its job is rolled back, and retried, counted, once its lease runs out).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

import psycopg

from . import logs, migrations, ops
from . import worker as w
from .enqueue import enqueue
from .handlers import Handlers
from .handlers import handlers as default_handlers
from .hooks import Hooks
from .jobs import ConfigError, JobQueueError, UnknownKind
from .options import Parser, WorkerOptions, add_flags, count, from_args, seconds
from .periodic import Schedules
from .periodic import schedules as default_schedules
from .preflight import (
    check_dsn,
    check_writable,
    connect,
    connect_checked,
    diagnose,
    one_line,
    preflight,
    refused_login,
    unreachable,
)
from .reaper import Reaper, ReaperConfig, prune

__all__ = ["DSN_ENV", "add_ops_commands", "add_reap_flags", "cmd_reap", "load_handlers", "main",
           "parser", "tenant_arg"]

PROG = f"python -m {__package__}"
DSN_ENV = "JOBQUEUE_DSN"
#: --listen-dsn's default, kept off the command line (where ``ps`` would show its password).
LISTEN_DSN_ENV = "JOBQUEUE_LISTEN_DSN"
OPS = ("stats", "jobs", "show", "retry", "cancel")
COMMANDS = ("worker", "reap", "prune", "migrate", "schema", "enqueue", *OPS)
DEBUG = "--debug"
LOG_FORMAT = "--log-format"

SIGNALS = ("SIGTERM or SIGINT stops the worker after its current job (or batch); a second one "
           "stops it at once (exit 130): the job in flight is rolled back and, once its lease "
           "runs out, retried, counted. Exit statuses: 0 stopped, 1 crashed, 2 bad "
           "configuration (one line on stderr), 3 lost the server for longer than --max-outage, "
           "4 stuck (a handler still ran a lease after its maximum runtime).")


def load_handlers(spec: str | None) -> Handlers:
    """Import ``module`` or ``module:attribute`` and return its handlers.

    The attribute (default ``handlers``) may be a ``Handlers`` or a mapping kind -> function;
    a module without one registered into this package's default registry as it was imported.
    """
    if not spec:
        return default_handlers
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        # Whatever the import raised (a missing module, a SyntaxError, an error in the module's
        # own top-level code) the worker cannot run: a configuration error, not a crash.
        raise ConfigError(f"cannot import handlers module {module_name!r}: "
                          f"{type(e).__name__}: {one_line(e)}") from e
    found = getattr(module, attr or "handlers", None)
    if found is None:
        if attr:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
        return default_handlers
    if isinstance(found, Handlers):
        return found
    if isinstance(found, Mapping):
        return Handlers(found)
    raise ConfigError(f"{spec} is a {type(found).__name__}, not a Handlers or a mapping "
                      "from kind to function")


def load_hooks(spec: str | None) -> Hooks | None:
    """Return the hooks the handlers module declared (its ``hooks``, a ``Hooks``), if any."""
    module = sys.modules.get((spec or "").partition(":")[0]) if spec else None
    found = getattr(module, "hooks", None)
    if found is None:
        return None
    if not isinstance(found, Hooks):
        raise ConfigError(f"{spec}.hooks is a {type(found).__name__}, not a jobqueue Hooks")
    return found


def load_schedules(spec: str | None) -> Schedules:
    """Return the periodic jobs the handlers module declared: its ``schedules``, or the default."""
    module = sys.modules.get((spec or "").partition(":")[0]) if spec else None
    found = getattr(module, "schedules", None)
    return found if isinstance(found, Schedules) else default_schedules


def parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="log every job (any position)")
    p.add_argument(DEBUG, action="store_true",
                   help="show a traceback for configuration errors too (any position)")
    p.add_argument(LOG_FORMAT, choices=logs.FORMATS, default="text",
                   help="text (default) or json: one object per line (any position)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    dsn: dict[str, Any] = {"default": os.environ.get(DSN_ENV),
           "help": f"the database (default: ${DSN_ENV}); log in as an ordinary role"}

    run = sub.add_parser("worker", help="run jobs until stopped (the default command)",
                         description=f"Run jobs until stopped. {SIGNALS}")
    run.add_argument("--dsn", **dsn)
    run.add_argument("--handlers", metavar="MODULE[:ATTR]", default=None,
                     help="import MODULE for its handlers (default: the registry of this package)")
    add_flags(run, WorkerOptions)
    run.set_defaults(func=cmd_worker)

    reap = sub.add_parser("reap", help="give jobs whose lease expired a final state")
    reap.add_argument("--dsn", **dsn)
    add_reap_flags(reap)
    reap.set_defaults(func=cmd_reap)

    pr = sub.add_parser("prune", help="delete finished jobs and runs older than an age, in batches")
    pr.add_argument("--dsn", **dsn)
    pr.add_argument("--older-than", type=seconds("older-than", zero=True), required=True,
                    help="age in seconds (e.g. 604800 for a week)")
    pr.add_argument("--batch", type=count("batch"), default=1000, help="rows per transaction")
    pr.add_argument("--pooler", action="store_true",
                    help="the DSN leads to a transaction pooler: no prepared statements")
    pr.set_defaults(func=cmd_prune)

    mi = sub.add_parser("migrate", aliases=["schema"],
                        help="apply the queue's migrations (as the role that owns the schema)")
    mi.add_argument("--dsn", **dsn)
    mi.add_argument("--tenant-type", choices=migrations.TENANT_TYPES, default=None,
                    help="the type of your tenant ids, fixed at install by the first migration "
                         "(default: bigint; later runs keep the installed type)")
    mi.add_argument("--lock-timeout", type=seconds("lock-timeout"),
                    default=migrations.LOCK_TIMEOUT,
                    help="wait at most S seconds for each lock, so that enqueues never wait "
                         "longer behind it; tried again up to "
                         f"{migrations.LOCK_TRIES} times (default: %(default)s)")
    mi.set_defaults(func=cmd_migrate)
    add_ops_commands(sub, dsn)
    add_enqueue(sub, dsn)
    return p


def add_enqueue(sub: Any, dsn: dict[str, Any]) -> None:
    """The ``enqueue`` command: one job, its id printed."""
    en = sub.add_parser("enqueue", help="queue one job and print its id")
    en.add_argument("kind", help="the job's kind")
    en.add_argument("--dsn", **dsn)
    en.add_argument("--tenant", required=True, help="the tenant's id (the installed type)")
    en.add_argument("--payload", type=json_object, default=None, metavar="JSON",
                    help="the job's payload, a JSON document (default: {})")
    en.add_argument("--queue", default="default", help="the queue (default: %(default)s)")
    en.add_argument("--priority", type=int, default=0,
                    help="higher runs first (default: 0; -10..10)")
    en.add_argument("--unique-key", default=None, metavar="KEY",
                    help="while a job with KEY is queued or running, print its id instead")
    en.add_argument("--run-after", type=seconds("run-after", zero=True), default=None,
                    metavar="S", help="seconds from now before a worker may take it")
    en.add_argument("--max-attempts", type=count("max-attempts", most=2_000_000_000), default=3,
                    help="attempts before the job is dead (default: %(default)s)")
    en.add_argument("--handlers", metavar="MODULE[:ATTR]", default=None,
                    help="refuse a kind that MODULE has no handler for")
    en.add_argument("--json", action="store_true", help='print {"id": N} as JSON')
    en.set_defaults(func=cmd_enqueue)


def json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"payload must be JSON, not {text!r} ({e})") from None


def tenant_arg(text: str) -> int | str:
    """Return the tenant id as given: a number only when it reads back the same, so that
    ``007`` (another tenant than 7 on a text install) is kept as written."""
    if text.lstrip("-").isdigit() and str(int(text)) == text:
        return int(text)
    return text


def cmd_enqueue(args: argparse.Namespace) -> int:
    """Queue one job (its own transaction); print its id."""
    known = load_handlers(args.handlers) if args.handlers else None
    tenant = tenant_arg(args.tenant)
    with connect_checked(args.dsn, "enqueue") as conn:
        try:
            job = enqueue(conn, args.kind, tenant=tenant, payload=args.payload,
                          queue=args.queue, priority=args.priority, unique_key=args.unique_key,
                          run_after=args.run_after, max_attempts=args.max_attempts, known=known)
        except UnknownKind as e:
            raise ConfigError(str(e)) from e
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as e:
            # What the database refuses to store: a tenant id not of the installed type
            # ('acme' on a bigint install), a payload jsonb cannot hold (\u0000), a value out
            # of its column's range. The input is wrong: one line, exit 2.
            raise ConfigError(f"cannot queue this job: {one_line(e)} (the tenant must be of "
                              "the installed tenant type, the payload JSON that PostgreSQL "
                              "stores)") from e
    print(json.dumps({"id": job}) if args.json else job)
    return 0


# -- the operator's commands (ops.py) -------------------------------------------------------------

def _job_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a job id is a positive integer, not {text!r}")
    return value


def add_ops_commands(sub: argparse._SubParsersAction[Any],
                     dsn: dict[str, Any]) -> list[argparse.ArgumentParser]:
    """Add stats, jobs, show, retry and cancel (an embedding command line may add them too)."""
    as_json: dict[str, Any] = {"action": "store_true",
                               "help": "print JSON (a stable contract, see ops.py)"}
    st = sub.add_parser("stats", help="jobs per status, kind and tenant; the oldest wait; "
                                      "kinds no running worker serves")
    st.set_defaults(func=cmd_stats)
    js = sub.add_parser("jobs", help="list jobs, newest first")
    js.add_argument("--status", choices=ops.STATUSES, default=None)
    js.add_argument("--kind", default=None)
    js.add_argument("--tenant", default=None, help="a tenant id")
    js.add_argument("--limit", type=count("limit"), default=50, help="at most N (default 50)")
    js.set_defaults(func=cmd_jobs)
    sh = sub.add_parser("show", help="one job and every attempt it had")
    sh.add_argument("id", type=_job_id, metavar="ID")
    sh.set_defaults(func=cmd_show)
    rt = sub.add_parser("retry", help="queue a dead (or cancelled) job again, with a fresh "
                                      "budget of attempts")
    rt.add_argument("id", type=_job_id, metavar="ID", nargs="?")
    rt.add_argument("--dead", action="store_true", help="every dead job (with --kind/--tenant: "
                                                        "of that kind, of that tenant)")
    rt.add_argument("--kind", default=None)
    rt.add_argument("--tenant", default=None)
    rt.add_argument("--attempts", type=count("attempts"), default=ops.RETRY_ATTEMPTS,
                    help="attempts it gets (max_attempts = attempts so far + N; "
                         "default %(default)s)")
    rt.set_defaults(func=cmd_retry)
    ca = sub.add_parser("cancel", help="cancel a queued job, or a running one cooperatively "
                                       "(its handler sees claim.cancelled(); its finish is "
                                       "fenced out)")
    ca.add_argument("id", type=_job_id, metavar="ID")
    ca.set_defaults(func=cmd_cancel)
    for p in (st, js, sh, rt, ca):
        p.add_argument("--dsn", **dsn)
        p.add_argument("--json", **as_json)
    return [st, js, sh, rt, ca]


def _ops_conn(args: argparse.Namespace) -> psycopg.Connection:
    return connect_checked(args.dsn, args.command)


def cmd_stats(args: argparse.Namespace) -> int:
    with _ops_conn(args) as conn:
        data = ops.stats(conn)
        now = ops.server_now(conn)  # ages by the server's clock, not this host's
    if args.json:
        print(ops.to_json(data))
        return 0
    jobs = data["jobs"]
    print(ops.table([[s, jobs.get(s, 0)] for s in ops.STATUSES], ["status", "jobs"]))
    print(f"\noldest queued job waiting: {ops.age(data['oldest_queued_s'])}")
    if data["by_kind"]:
        print()
        print(ops.table([[k, *(c.get(s, 0) for s in ops.STATUSES)]
                         for k, c in sorted(data["by_kind"].items())], ["kind", *ops.STATUSES]))
    busy = sorted(data["by_tenant"].items(),
                  key=lambda kv: -(kv[1].get("queued", 0) + kv[1].get("running", 0)))[:10]
    if busy:
        print(f"\ntenants (the {len(busy)} with most queued and running of "
              f"{len(data['by_tenant'])}):")
        print(ops.table([[t, *(c.get(s, 0) for s in ops.STATUSES)] for t, c in busy],
                        ["tenant", *ops.STATUSES]))
    print(f"\nworkers running: {len(data['workers'])}")
    if data["workers"]:
        print(ops.table([[w_["name"], ",".join(w_["kinds"]), ops.ago(w_["started"], now),
                          ops.ago(w_["last_seen"], now)] for w_ in data["workers"]],
                        ["worker", "kinds", "started", "last seen"]))
    idle = data["kinds_without_worker"]
    print(f"kinds queued that no running worker serves: {', '.join(idle) if idle else 'none'}")
    stale = data.get("lease_expired") or []
    print(f"running jobs whose lease ran out (their worker stopped, starved or stuck): "
          f"{len(stale) if stale else 'none'}")
    if stale:
        print(ops.table([[r["id"], r["kind"], r["tenant"], f"{r['attempts']}/{r['max_attempts']}",
                          ops.age(r["expired_s"])] for r in stale],
                        ["job", "kind", "tenant", "attempts", "lease ran out"]))
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    with _ops_conn(args) as conn:
        rows = ops.jobs(conn, status=args.status, kind=args.kind, tenant=args.tenant,
                        limit=args.limit)
        now = ops.server_now(conn)
    if args.json:
        keys = ("id", "kind", "tenant", "status", "attempts", "last_error")
        print(ops.to_json([{k: r[k] for k in keys} for r in rows]))
        return 0
    if not rows:
        print("no jobs")
        return 0
    print(ops.table([[r["id"], r["kind"], r["tenant"], r["status"],
                      f"{r['attempts']}/{r['max_attempts']}", ops.ago(r["created"], now),
                      ops.first_line(r["last_error"])] for r in rows],
                    ["id", "kind", "tenant", "status", "attempts", "created", "last error"]))
    return 0


#: ``show`` prints at most this much of a payload (``--json`` prints it whole).
SHOWN_PAYLOAD = 2000


def cmd_show(args: argparse.Namespace) -> int:
    with _ops_conn(args) as conn:
        job = ops.show(conn, args.id)
        now = ops.server_now(conn)
    if args.json:
        print(ops.to_json(job))
        return 0
    print(f"job {job['id']}: {job['kind']} for tenant {job['tenant']}, {job['status']}, "
          f"attempts {job['attempts_made']} of {job['max_attempts']}")
    wait = "" if job["run_after"] <= now or job["status"] != "queued" else \
        f"; runs in {ops.age((job['run_after'] - now).total_seconds())}"
    print(f"  created {ops.ago(job['created'], now)}{wait}; finished "
          f"{ops.ago(job['finished'], now)}")
    payload = json.dumps(job["payload"], default=str)
    if len(payload) > SHOWN_PAYLOAD:  # a 10 MB payload is not a terminal's business
        payload = (f"{payload[:SHOWN_PAYLOAD]}... ({len(payload):,} characters; --json shows "
                   "it whole)")
    print(f"  payload {payload}")
    if job["last_error"]:
        print(f"  last error: {ops.first_line(job['last_error'], 200)}")
    if job["attempts"]:
        print()
        print(ops.table([[a["attempt"], a["worker"] or "-", ops.ago(a["started"], now),
                          "-" if not (a["started"] and a["finished"]) else
                          ops.age((a["finished"] - a["started"]).total_seconds()),
                          a["outcome"] or "?", ops.first_line(a["error"], 70)]
                         for a in job["attempts"]],
                        ["attempt", "worker", "started", "took", "outcome", "error"]))
        last = next((a for a in reversed(job["attempts"]) if a["error"]), None)
        if last and "\n" in last["error"]:
            print(f"\nattempt {last['attempt']}'s error:\n{last['error']}")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    if (args.id is None) == (not args.dead):
        raise ConfigError("retry takes a job id, or --dead (every dead job, with --kind/--tenant "
                          "to choose): one of the two")
    if args.id is not None and (args.kind or args.tenant):
        raise ConfigError("--kind and --tenant choose jobs for --dead; a job id is one job")
    with _ops_conn(args) as conn:
        skipped: list[dict[str, Any]] = []
        rows = [ops.retry(conn, args.id, args.attempts)] if args.id is not None else \
            ops.retry_dead(conn, kind=args.kind, tenant=args.tenant, attempts=args.attempts,
                           skipped=skipped)
    for s in skipped:
        # On stderr: --json's output stays the list of jobs queued again.
        print(f"job {s['id']} ({s['kind']}, tenant {s['tenant']}) left dead: its unique key "
              f"{s['unique_key']!r} is held by job {s['held_by']} ({s['held_by_status']})",
              file=sys.stderr)
    if args.json:
        print(ops.to_json(rows))
        return 0
    for r in rows:
        print(f"job {r['id']} ({r['kind']}, tenant {r['tenant']}) queued again: attempts "
              f"{r['attempts']} so far, up to {r['max_attempts']}")
    print(f"queued {len(rows)} job{'s' if len(rows) != 1 else ''} again" +
          (f", {len(skipped)} left dead (their unique key is taken)" if skipped else ""))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _ops_conn(args) as conn:
        was = ops.cancel(conn, args.id)
    if args.json:
        print(ops.to_json({"id": args.id, "was": was, "status": "cancelled"}))
        return 0
    note = "" if was == "queued" else (": its worker is not interrupted; its handler sees "
                                       "claim.cancelled() at the next heartbeat and its finish "
                                       "is fenced out; retry refuses it until that attempt ends "
                                       "or its lease, no longer extended, runs out")
    print(f"job {args.id} cancelled (was {was}){note}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    if getattr(args, "listen_dsn", None) is None and os.environ.get(LISTEN_DSN_ENV):
        args.listen_dsn = check_dsn(os.environ[LISTEN_DSN_ENV], LISTEN_DSN_ENV)
    options = from_args(WorkerOptions, args)
    # Its run() refuses to start without handlers, then runs the preflight.
    worker = w.Worker(args.dsn, options, load_handlers(args.handlers),
                      schedules=load_schedules(args.handlers), hooks=load_hooks(args.handlers))
    w.stop_on_signals(worker)
    worker.run()
    return w.EXIT_STOPPED


def add_reap_flags(p: argparse.ArgumentParser) -> None:
    """The reaper's flags."""
    p.add_argument("--requeue", action="store_true",
                   help="also requeue expired jobs that have attempts left")
    p.add_argument("--grace", type=seconds("grace", zero=True), default=ReaperConfig.grace,
                   help="seconds past the lease before acting (default: %(default)s)")
    p.add_argument("--loop", type=seconds("loop"), default=None,
                   help="keep reaping every S seconds until stopped")
    p.add_argument("--max-outage", type=seconds("max-outage"), default=None,
                   help="with --loop: exit (status 3) after S seconds without the server")
    p.add_argument("--pooler", action="store_true",
                   help="the DSN leads to a transaction pooler (PgBouncer in transaction "
                        "mode): no prepared statements")


def cmd_reap(args: argparse.Namespace, events: Any = None) -> int:
    """Reap once (print what moved) or, with --loop, until stopped."""
    config = ReaperConfig(grace=args.grace, requeue=args.requeue,
                          interval=args.loop or ReaperConfig.interval)
    pooler = getattr(args, "pooler", False)
    # Looping, it waits for a server not reachable yet, as a worker does; once, it does not.
    outage = w.Outage("reaper", args.max_outage) if args.loop is not None else None
    while True:
        try:
            preflight(args.dsn, "reaper", pooler=pooler)
            break
        except ConfigError as e:
            if outage is None or not unreachable(e):
                raise
            outage.failed(e, "cannot reach the server at start")
    if args.loop is None:
        with connect(args.dsn, "reaper", pooler=pooler) as conn:
            reaped = Reaper(conn, config).run_once()
        for job in reaped:
            print(f"job {job['id']}: {job['status']} (attempts {job['attempts']})")
        print(f"reaped {len(reaped)} job{'s' if len(reaped) != 1 else ''}")
        return 0
    run_reaper(args.dsn, config, max_outage=args.max_outage, events=events, pooler=pooler)
    return 0


class StopFlag:
    """Set by SIGTERM/SIGINT: the reaper finishes its batch, then stops."""

    stopped = False

    def stop(self, signum: int | None = None, frame: object = None) -> None:
        self.stopped = True


def run_reaper(dsn: str, config: ReaperConfig, *, max_outage: float | None = None,
               events: Any = None, pooler: bool = False) -> int:
    """Reap every interval until SIGTERM/SIGINT, reconnecting like a worker; return the count."""
    flag = StopFlag()
    outage = w.Outage("reaper", max_outage)
    w.stop_on_signals(flag)
    total = 0
    while not flag.stopped:
        try:
            with connect(dsn, "reaper", pooler=pooler) as conn:
                check_writable(conn)  # a standby: an outage, not a success to start over from
                outage.ok()
                total += Reaper(conn, config, events).run_forever(stop=lambda: flag.stopped)
        except w.LOST as e:
            if refused_login(e):  # a password or a database changed since the start
                raise ConfigError(diagnose(e)) from e
            outage.failed(e)
    return total


def cmd_prune(args: argparse.Namespace) -> int:
    preflight(args.dsn, "prune", pooler=args.pooler)
    with connect(args.dsn, "prune", pooler=args.pooler) as conn:
        gone = prune(conn, args.older_than, batch=args.batch)
    print(f"pruned {gone['jobs']} jobs and {gone['job_runs']} job_runs rows")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Apply the migrations not applied yet; print their names, or that none was needed."""
    with connect_checked(args.dsn, "migrate") as conn:
        try:
            applied = migrations.migrate(conn, args.tenant_type,
                                         lock_timeout=args.lock_timeout)
        except psycopg.errors.InsufficientPrivilege as e:
            raise ConfigError(f"role {conn.info.user!r} may not create the queue's schema "
                              f"({one_line(e)}): run migrate as the role that will own the "
                              "schema jobqueue (the database owner, say), not the worker's") from e
    for name in applied:
        print(f"applied {name}")
    print(f"{len(applied)} migration{'s' if len(applied) != 1 else ''} applied" if applied
          else "up to date")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = bool({"-v", "--verbose"} & set(argv))
    debug = DEBUG in argv
    log_format = _take_log_format(argv)
    argv = [a for a in argv if a not in ("-v", "--verbose", DEBUG)]
    if not any(a in COMMANDS for a in argv[:2]) and not {"-h", "--help"} & set(argv[:1]):
        argv.insert(0, "worker")  # `python -m NAME --dsn DSN` runs a worker
    p = parser()
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return w.EXIT_CONFIG
    logs.setup(verbose=verbose, fmt=log_format)
    if not args.dsn:
        p.error(f"--dsn is required (or set {DSN_ENV})")
    try:
        # Where it was read, before anything connects: the flag's value, or the variable's.
        check_dsn(args.dsn, "--dsn" if args.dsn != os.environ.get(DSN_ENV) else DSN_ENV)
        code = int(args.func(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except ConfigError as e:
        if debug:
            raise
        print(f"{PROG} {args.command}: {e}", file=sys.stderr)
        return w.EXIT_CONFIG
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable,
            psycopg.errors.UndefinedColumn) as e:
        # Past the preflight (a grant revoked, the schema dropped while running): still the
        # configuration, not a bug.
        if debug:
            raise
        print(f"{PROG} {args.command}: {one_line(e)}: check the migrations (`migrate`) and "
              "the grants of this role (README)", file=sys.stderr)
        return w.EXIT_CONFIG
    except w.ServerLost as e:
        print(f"{PROG} {args.command}: {e}", file=sys.stderr)
        return w.EXIT_SERVER_LOST
    except JobQueueError as e:
        print(f"{PROG} {args.command}: {e}", file=sys.stderr)
        return w.EXIT_CRASHED
    except BrokenPipeError:
        # The reader went away (`jobqueue stats | head -1`): it had what it wanted. Quiet, and
        # nothing more written to the closed pipe at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        # A second stop signal (or an interrupt a handler raised): said, not silent. A job in
        # hand is not lost: its lease runs out and it is retried, counted.
        logging.getLogger("jobqueue").warning(
            "%s %s stopped at once (interrupted): a job it held runs again once its lease runs "
            "out", PROG, args.command)
        return 130


def _take_log_format(argv: list[str]) -> str:
    """Remove ``--log-format F`` (or ``--log-format=F``) from argv, wherever it is; return F.

    A bad value is left in place for the parser to refuse with the valid choices.
    """
    fmt = "text"
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == LOG_FORMAT and i + 1 < len(argv) and argv[i + 1] in logs.FORMATS:
            fmt = argv[i + 1]
            del argv[i:i + 2]
        elif a.startswith(LOG_FORMAT + "=") and a.split("=", 1)[1] in logs.FORMATS:
            fmt = a.split("=", 1)[1]
            del argv[i]
        else:
            i += 1
    return fmt
