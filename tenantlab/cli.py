"""The ``tenantlab`` command: the embedded server, the lab, and ``reproduce``."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import psycopg
from jobqueue import ConfigError, JobQueueError, diagnose, refused_login
from jobqueue.options import Parser, count
from psycopg.conninfo import conninfo_to_dict

from . import db, gitsave, labenv, labs, pgbouncer, reproduce, settings, validate
from .errors import ConfigurationError, TenantlabError
from .experiments import REGISTRY
from .server import REPO, Server, ServerError, embedded, port_free

log = logging.getLogger("tenantlab")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"port must be a number from 1024 to 65535, not {text!r}") from None
    if not 1024 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be from 1024 to 65535, not {port}")
    return port


def cmd_up(args: argparse.Namespace) -> int:
    server = embedded()
    started = server.up(port=args.port)
    dsn = server.dsn()
    db.ensure_template(dsn)
    print(f"{'started' if started else 'already running'}: PostgreSQL in {server.home}",
          file=sys.stderr)
    if args.pgbouncer:
        bouncer, fresh = pgbouncer.start_daemon(dsn)
        print(f"{'started' if fresh else 'already running'}: PgBouncer {pgbouncer.version()} "
              f"(transaction mode) on 127.0.0.1:{bouncer.port}, for {db.WORKER}",
              file=sys.stderr)
    print(dsn)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    server = embedded()
    # Under the labs' lock: a lab starting meanwhile either is seen here or finds the server down.
    with labs.locked(server.home) if server.home.is_dir() else nullcontext():
        if not args.force:
            # Removing the state directory would also pull a server inside it (the suite's
            # .tenantlab/gw1) from under it: refuse, naming it.
            labs.refuse_while_running(server.home, servers=args.purge)
        elif args.purge:
            for inside in labs.servers_inside(server.home):
                Server(inside).down()
        if pgbouncer.stop_daemon():
            print("stopped PgBouncer")
        if args.purge:
            server.purge()
            print(f"stopped and removed {server.home}")
            return 0
        print("stopped" if server.down() else "not running")
        labs.server_stopped(server.home)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if url := settings.database_url():
        print(f"using TENANTLAB_DATABASE_URL: PostgreSQL {db.server_version(url)}")
        return 0
    if settings.ignored_database_url():
        print("DATABASE_URL is set but not used: the kit uses TENANTLAB_DATABASE_URL "
              "(or TENANTLAB_USE_DATABASE_URL=1)", file=sys.stderr)
    st = embedded().status()
    if not st["running"]:
        print(f"not running (state in {st['home']}): start it with `tenantlab up`")
        return 1
    print(f"running: pid {st['pid']}, port {st['port']}, "
          f"PostgreSQL {db.server_version()}, state in {st['home']}")
    print(embedded().dsn())
    return 0


def notebooks_dir() -> Path:
    if env := settings.notebooks():
        return env
    for candidate in (REPO / "notebooks", Path.cwd() / "notebooks"):
        if candidate.is_dir():
            return candidate
    raise ServerError("no notebooks/ directory found: run from the checkout or set TENANTLAB_NOTEBOOKS")


def cmd_lab(args: argparse.Namespace) -> int:
    nbdir = notebooks_dir()
    kit = REPO / "notebooks" / "kit.py"
    if kit.exists() and not (nbdir / "kit.py").exists():
        # TENANTLAB_NOTEBOOKS elsewhere: the notebooks' first cell imports through kit.py.
        shutil.copy(kit, nbdir / "kit.py")
    # A JupyterLab whose lab was killed (kill -9, a closed terminal, where the system does not
    # end it with its lab) holds its port and the server: name it and say how to stop it.
    if orphans := labs.orphans(embedded().home):
        raise ConfigurationError("; ".join(lab.describe() for lab in orphans) + "; then run again")
    # Before the server starts and before a link is printed: a busy port would hand the
    # participant a link to whatever holds it.
    if not port_free(args.port, args.ip):
        raise TenantlabError(f"JupyterLab's port {args.port} on {args.ip} is taken by another "
                             "process: choose another with `tenantlab lab --port N` "
                             "(`make lab PORT=N`)")
    token = args.token or settings.jupyter_token() or secrets.token_hex(16)
    # Both, explicitly: a shell that starts us in the background ignores SIGINT, and Python
    # then never turns it into KeyboardInterrupt. From here on, so that a stop while the server
    # starts still removes this lab's marker (and stops a server only this lab used).
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    # Its own marker, before the server starts: `tenantlab down` and `make clean` refuse while
    # any lab runs, and the last lab out stops a server that a lab started.
    with labs.lab(embedded(), f"{args.ip}:{args.port}", port=args.db_port,
                  external=settings.database_url()) as dsn:
        return _run_lab(args, nbdir, token, dsn)


def _run_lab(args: argparse.Namespace, nbdir: Path, token: str, dsn: str) -> int:
    db.ensure_template(dsn)
    # The token goes through the environment, which `ps` does not show to other users;
    # Jupyter reads JUPYTER_TOKEN itself.
    env = dict(os.environ, TENANTLAB_HOME=str(embedded().home), JUPYTER_TOKEN=token)
    if url := settings.database_url():
        env[settings.DATABASE_URL] = url  # the kernels find the same server
    if args.solutions:
        env[settings.SOLUTIONS] = "1"  # the kernels' exercises read it
    # The notebooks' kernel "tenantlab" and JupyterLab's defaults (no news, no update pop-up),
    # in this environment: a user's own python3 kernelspec cannot stand in for the kit's.
    try:
        labenv.install()
    except OSError as e:
        raise TenantlabError(f"cannot install the notebooks' kernel in {sys.prefix} ({e.strerror}): "
                             "run `python -m tenantlab.labenv` as the environment's owner") from e
    cmd = jupyter_command(args, nbdir, labs.workspaces(embedded().home))
    # Its own session: a Ctrl-C reaches us, and we stop Jupyter before the server. And it ends
    # with us whatever ends us (a kill -9, a closed terminal): no orphan keeps the port.
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_end_with_parent)
    labs.note_jupyter(embedded().home, proc.pid)  # if it outlives us, the next lab names it
    try:
        # The link once it works: printed earlier, a click got "connection refused".
        if _answers(proc, args.ip, args.port, token):
            print(f"JupyterLab: {lab_url(args.ip, args.port, token)}", file=sys.stderr)
        return proc.wait()
    except KeyboardInterrupt:
        print("stopping JupyterLab ...", file=sys.stderr)
        return 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def jupyter_command(args: argparse.Namespace, nbdir: Path, workspaces: Path) -> list[str]:
    """Return JupyterLab's command line for this lab.

    gitsave: a notebook run and saved stays unchanged for git (`git pull` goes through). A
    workspaces directory of this lab's own (removed when it ends): a second lab on the checkout,
    or a later one, does not reopen this one's tabs and start a kernel for each.
    """
    cmd = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={nbdir}",
           f"--ServerApp.ip={args.ip}", f"--ServerApp.port={args.port}",
           "--ServerApp.port_retries=0", gitsave.JUPYTER_OPTION,
           f"--LabApp.workspaces_dir={workspaces}"]
    if args.no_browser:
        cmd.append("--no-browser")
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd


def lab_url(ip: str, port: int, token: str) -> str:
    """Return the link a participant clicks: an IPv6 address in brackets, the token encoded."""
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/lab?token={urllib.parse.quote(token, safe='')}"


def _answers(proc: subprocess.Popen, ip: str, port: int, token: str,
             timeout: float = 180) -> bool:
    """Wait until JupyterLab answers on its port (True), or its process ended (False)."""
    import urllib.request

    near = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(ip, ip)
    url = lab_url(near, port, token).replace("/lab?", "/api/status?")
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.25)
    return proc.poll() is None


def _end_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGTERM when the lab's process dies (JupyterLab
    then stops its kernels); elsewhere nothing (a stop by Ctrl-C or SIGTERM still ends it)."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cmd_reproduce(args: argparse.Namespace) -> int:
    unknown = [i for i in args.ids if i not in REGISTRY]
    if unknown:
        valid = ", ".join(REGISTRY)
        print(f"tenantlab reproduce: unknown finding {', '.join(unknown)}; valid ids: {valid}",
              file=sys.stderr)
        return 2
    result = reproduce.run(args.ids, full=True if args.full else None, repeat=args.repeat)
    print(f"PostgreSQL {result['server_version']}")
    print(reproduce.table(result))
    if args.json:
        reproduce.write_json(result, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.report:
        from . import report

        report.write(result, args.report)
        print(f"wrote {args.report}", file=sys.stderr)
    return 0


def add_check_command(sub: argparse._SubParsersAction) -> None:
    """Add ``check``: every failure mode run against each queue, one matrix with evidence."""
    from .check.scenarios import SCENARIOS

    ck = sub.add_parser("check", help="run the failure modes against queue libraries: one "
                                      "matrix, a witness under every ✗")
    ck.add_argument("--queue", action="append", default=None, metavar="Q",
                    help="a queue to check (repeatable; default: every one): naive, jobqueue, "
                         "procrastinate, pgqueuer, awa, or an entry point's name")
    ck.add_argument("--scenario", action="append", default=None, metavar="S",
                    choices=list(SCENARIOS),
                    help=f"a scenario (repeatable; default: all): {', '.join(SCENARIOS)}")
    ck.add_argument("--runs", type=count("runs", most=20), default=1, metavar="N",
                    help="runs per cell: ✗ k of N (1 to 20; default 1)")
    ck.add_argument("--json", metavar="FILE", type=validate.output_file,
                    help="write the matrix as JSON")
    ck.add_argument("--html", metavar="FILE", type=validate.output_file,
                    help="write the matrix as one offline HTML page")
    ck.add_argument("--repro", nargs=2, metavar=("QUEUE", "SCENARIO"),
                    help="print the standalone script (the library and its driver only) that "
                         "reproduces a peer's failing cell, e.g. --repro pgqueuer crash")
    ck.add_argument("--setting", default="default", choices=("default", "scaled", "recommended"),
                    help="with --repro: the row (default: default, the ★ row)")
    ck.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from .check import adapter, matrix, repro

    if args.repro:
        queue, scenario = args.repro
        script = repro.script(queue, args.setting, scenario)
        if script is None:
            scripts = ", ".join(f"{q} {s} ({st})" for q, st, s in repro.SCRIPTS)
            print(f"tenantlab check: no script for {queue} {scenario} ({args.setting}); there "
                  f"are: {scripts}", file=sys.stderr)
            return 2
        print(script.read_text(), end="")
        return 0

    if args.queue:
        known = {a.name for a in adapter.rows()}
        unknown = [q for q in args.queue if q not in known]
        if unknown:
            print(f"tenantlab check: unknown queue {', '.join(unknown)}; valid: "
                  f"{', '.join(sorted(known))}", file=sys.stderr)
            return 2
    with db.server_session():  # the embedded server, started (and stopped) here if need be
        result = matrix.run(args.queue, args.scenario, args.runs, progress=matrix.stderr)
    print(matrix.table(result))
    if args.json:
        matrix.write_json(result, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.html:
        matrix.write_html(result, args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    return _list_or_remove(args.yes, lambda dsn, dry: db.uninstall(dsn, dry_run=dry),
                           "nothing of tenantlab's on {host}", "tenantlab uninstall --yes")


def cmd_clean_scratch(args: argparse.Namespace) -> int:
    return _list_or_remove(args.yes,
                           lambda dsn, dry: db.clean_scratch(dsn, dry_run=dry, every=args.all),
                           "no leftover scratch databases or exercise roles on {host}",
                           "tenantlab clean-scratch --yes")


def _list_or_remove(yes: bool, act: Callable[[str, bool], list[str]], nothing: str,
                    command: str) -> int:
    """List what `act` would remove (exit 1), or remove it with --yes (exit 0); 0 if none."""
    dsn = db.admin_dsn()
    host = conninfo_to_dict(dsn).get("host", "")
    found = act(dsn, True)
    if not found:
        print(nothing.format(host=host))
        return 0
    if not yes:
        print(f"would remove from {host}:", *found, sep="\n  ")
        print(f"run `{command}` to remove them")
        return 1
    for item in act(dsn, False):
        print(f"removed {item}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="tenantlab", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    p.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    p.add_argument("--database-url", metavar="URL", default=None,
                   type=validate.dsn,
                   help="admin URL of a PostgreSQL 15+ server to use instead of the embedded one "
                        "(default: TENANTLAB_DATABASE_URL)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start the embedded PostgreSQL 17; print the admin DSN last")
    up.add_argument("--port", type=_port, default=None,
                    help="TCP port on 127.0.0.1 (default: the last one, else 54317 or a free one)")
    up.add_argument("--pgbouncer", action="store_true",
                    help="also start PgBouncer in transaction mode in front of it (notebook 12)")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop the embedded server")
    down.add_argument("--purge", action="store_true", help="also remove its data directory")
    down.add_argument("--force", action="store_true", help="even while a lab is using it")
    down.set_defaults(func=cmd_down)

    sub.add_parser("status", help="is the server running, and where").set_defaults(func=cmd_status)

    lab = sub.add_parser("lab", help="start the server (unless TENANTLAB_DATABASE_URL) and JupyterLab")
    lab.add_argument("--port", type=_port, default=8888, help="JupyterLab's port (default 8888)")
    lab.add_argument("--ip", default="127.0.0.1", type=validate.listen_address,
                     help="address JupyterLab listens on")
    lab.add_argument("--db-port", type=_port, default=None, help="the embedded server's port")
    lab.add_argument("--token", default=None,
                     help="Jupyter token (default: JUPYTER_TOKEN, else random; printed). An option "
                          "shows in `ps`: prefer JUPYTER_TOKEN")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser")
    lab.add_argument("--solutions", action="store_true",
                     help="instructor view: the exercises show the kit's answer expanded")
    lab.set_defaults(func=cmd_lab)

    rep = sub.add_parser("reproduce", help="regenerate the article's findings on this server")
    rep.add_argument("ids", nargs="*", metavar="ID",
                     help=f"finding ids (default: all): {', '.join(REGISTRY)}")
    rep.add_argument("--full", action="store_true",
                     help="the article's sizes (slower; default: TENANTLAB_SIZE, else workshop)")
    rep.add_argument("--repeat", type=count("repeat", most=reproduce.MAX_REPEAT), default=1, metavar="N",
                     help="run every finding N times: reproduced k of N, numbers as ranges "
                          f"(1 to {reproduce.MAX_REPEAT}; default 1)")
    rep.add_argument("--json", metavar="FILE", type=validate.output_file,
                     help="write the results as JSON")
    rep.add_argument("--report", metavar="FILE", type=validate.output_file,
                     help="write one HTML page with claims, measurements, verdicts and charts")
    rep.set_defaults(func=cmd_reproduce)

    add_check_command(sub)  # check: failure modes against queue libraries (issue 20)

    cs = sub.add_parser("clean-scratch",
                        help="remove the scratch databases and exercise roles that stopped runs "
                             "left behind (a killed kernel, `down --force` during a check)")
    cs.add_argument("--yes", action="store_true", help="remove them (default: list them)")
    cs.add_argument("--all", action="store_true",
                    help="every scratch database nobody is connected to, also those of "
                         "processes on other machines (a shared server)")
    cs.set_defaults(func=cmd_clean_scratch)
    un = sub.add_parser("uninstall", help="remove the kit's databases and roles from the server")
    un.add_argument("--yes", action="store_true", help="remove them (without: only list them)")
    un.set_defaults(func=cmd_uninstall)

    add_queue_commands(sub)  # worker, enqueue, reap, bench, export-worker
    add_exercise_commands(sub)  # exercises list|check|starter|solution
    return p


#: Commands that manage the embedded server only: an outside server's URL means nothing to them.
EMBEDDED_ONLY = ("up", "down")


def main(argv: list[str] | None = None) -> int:
    # A terminal or PYTHONIOENCODING that cannot show ✓ or an accent gets a stand-in character,
    # never a UnicodeEncodeError after the work is done.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="tenantlab: %(message)s")
    try:
        if args.database_url and args.command in EMBEDDED_ONLY:
            raise ConfigurationError(
                f"{args.command} manages only the embedded server; --database-url names "
                "another one: drop the flag (an outside server is started and stopped by its owner)")
        if args.database_url:
            # Child processes (workers, kernels) inherit it, as they would the variable itself.
            os.environ[settings.DATABASE_URL] = args.database_url
        settings.check()  # every variable, before any work
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `tenantlab ... --json | head -1`: the reader has all it wanted. Silence the flush at
        # exit too (it would write to the closed pipe and print a second error).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        message = explain(e)
        if args.debug or message is None:
            raise
        print(f"tenantlab {args.command}: {message}", file=sys.stderr)
        return 2 if configuration(e) else 1


def configuration(e: BaseException) -> bool:
    """Return True for bad input (exit 2): a flag, a variable, a refused login, no database.

    The worker's and the reaper's configuration errors keep jobqueue's status (2) too.
    """
    return isinstance(e, ConfigError | ConfigurationError) or refused_login(e) is not None


def explain(e: BaseException) -> str | None:
    """Return one or two lines for a failure the user can act on; None for a bug (traceback)."""
    if isinstance(e, TenantlabError | JobQueueError):
        return str(e)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, psycopg.errors.ReadOnlySqlTransaction):
        return (f"{first}\nthe kit writes to the server, and this session is read-only: is "
                "default_transaction_read_only set in PGOPTIONS, or on the role or database? "
                "(or is this a standby?)")
    if isinstance(e, psycopg.ProgrammingError) and first.startswith("bad value for"):
        return (f"{first}: check the PG* environment variables (PGCONNECT_TIMEOUT, ...) and the "
                "parameters in the server's URL")
    if isinstance(e, psycopg.errors.ObjectInUse):
        # CREATE DATABASE ... TEMPLATE while a psql or a GUI is connected to the template: the
        # server answered, so this is not an outage (nor a password).
        return (f"{first}\nclose the other session on that database (a psql or a GUI left "
                "connected to it?), then run again; `tenantlab status` names the server")
    if isinstance(e, psycopg.errors.InsufficientPrivilege) and "tenantlab_" in first:
        # On 16+ a CREATEROLE admin manages only the roles it created (or was given ADMIN on).
        return (f"{first}\nthe kit was set up on this server by another admin: ask them to run "
                "`tenantlab uninstall --yes`, or to grant you both kit roles WITH ADMIN OPTION")
    if isinstance(e, psycopg.errors.InsufficientPrivilege):
        return (f"{first}\nthe admin role needs CREATEROLE and CREATEDB (a superuser, or a managed "
                "service's admin role); see the README's \"With your own server\"")
    if isinstance(e, psycopg.OperationalError):
        where = "TENANTLAB_DATABASE_URL" if settings.database_url() else "the embedded server"
        if refused_login(e):  # the server answered: a wrong password or database, not an outage
            return f"{diagnose(e)}; the server: {where}"
        return (f"cannot connect to PostgreSQL: {first}\n"
                f"check {where} (is it running, are the user and password right?); "
                "`tenantlab status` tells which server is used")
    return None


# --- the queue: worker, enqueue, reap, bench, export-worker ----------------------------------

DSN_HELP = ("database to work on (default: TENANTLAB_DSN, else the playground database); "
            "always logs in as tenantlab_worker")


#: `enqueue --count` at most: about five seconds of inserts; more is a loop of enqueues.
MAX_ENQUEUE = 100_000
#: `enqueue --max-attempts` at most: retries beyond that are a bug, not a policy.
MAX_ATTEMPTS = 1000


def _events(text: str) -> str:
    return text if text == "-" else validate.output_file(text)


def _tenant(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"tenant must be a number from 1 to 100, not {text!r}")
    return value


def add_queue_commands(sub: argparse._SubParsersAction) -> None:
    """Add the worker, enqueue, reap, bench and export-worker subcommands."""
    from jobqueue.cli import add_reap_flags
    from jobqueue.options import add_flags, seconds

    from . import kinds
    from .worker import WorkerConfig

    w = sub.add_parser("worker", help="run a worker: claim and run jobs until stopped")
    add_flags(w, WorkerConfig)
    w.add_argument("--events", default="-", type=_events,
                   help="event log file (default: stdout)")
    w.add_argument("--dsn", default=None, type=validate.dsn, help=DSN_HELP)
    w.set_defaults(func=cmd_worker)

    e = sub.add_parser("enqueue", help="queue jobs")
    e.add_argument("--kind", required=True, choices=list(kinds.handlers), help="what the job does")
    e.add_argument("--tenant", type=_tenant, default=None,
                   help="tenant 1..100 (default: spread over all)")
    e.add_argument("--count", type=count("count", most=MAX_ENQUEUE), default=1,
                   help=f"how many jobs (at most {MAX_ENQUEUE:,}: a few seconds)")
    e.add_argument("--seconds", type=seconds("seconds", zero=True), default=0.0,
                   help="work duration (sleep, crash)")
    e.add_argument("--max-attempts", type=count("max-attempts", most=MAX_ATTEMPTS), default=3,
                   help=f"attempts before dead (at most {MAX_ATTEMPTS})")
    e.add_argument("--dsn", default=None, type=validate.dsn, help=DSN_HELP)
    e.set_defaults(func=cmd_enqueue)

    r = sub.add_parser("reap", help="move exhausted jobs whose lease expired to dead")
    add_reap_flags(r)
    r.add_argument("--dsn", default=None, type=validate.dsn, help=DSN_HELP)
    r.set_defaults(func=cmd_reap)

    b = sub.add_parser("bench", help="what the queue costs per job: the designs side by side")
    from . import bench

    bench.add_arguments(b)
    b.set_defaults(func=bench.cmd_bench)

    qu = sub.add_parser("queue", help="see the queue and act on it: stats, jobs, show ID, "
                                      "retry, cancel (python -m jobqueue's)")
    from jobqueue.cli import add_ops_commands

    qsub = qu.add_subparsers(dest="queue_command", required=True, metavar="COMMAND")
    for p in add_ops_commands(qsub, {"default": None, "type": validate.dsn, "help": DSN_HELP}):
        p.set_defaults(func=cmd_queue, ops=p.get_default("func"))

    x = sub.add_parser("export-worker",
                       help="copy the jobqueue package into DIR, as it is, to vendor it "
                            "(or: pip install ./jobqueue)")
    x.add_argument("dir", metavar="DIR", type=validate.directory,
                   help="directory to write into (created if missing)")
    x.add_argument("--name", default="jobqueue",
                   help="the copy's directory name (default: jobqueue); its imports are "
                        "relative, so any name works")
    x.add_argument("--force", action="store_true",
                   help="write into DIR/NAME even if it holds files no earlier export wrote "
                        "(same-named files are overwritten; nothing is deleted)")
    x.set_defaults(func=cmd_export_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    from jobqueue import (
        EXIT_CONFIG,
        EXIT_SERVER_LOST,
        EXIT_STOPPED,
        ConfigError,
        ServerLost,
        stop_on_signals,
    )
    from jobqueue.options import from_args

    from .events import EventLog
    from .worker import WorkerConfig, lab_worker, worker_dsn

    try:
        config = from_args(WorkerConfig, args)
        config.make_design()  # refuse what cannot work before connecting
    except ConfigError as e:
        print(f"tenantlab worker: {e}", file=sys.stderr)
        return EXIT_CONFIG
    config.name = config.name or f"worker-{os.getpid()}"
    if not args.verbose:
        # The lab's worker records every job in its event log; its stderr (a pipe the
        # experiments read at the end) gets the job lines only with -v.
        logging.getLogger("jobqueue.jobs").setLevel(logging.CRITICAL)  # the queue's job lines
    events = EventLog(config.name, args.events)
    try:
        worker = lab_worker(worker_dsn(args.dsn), config, events)
        stop_on_signals(worker)
        worker.run()
    except ServerLost as e:
        print(f"tenantlab worker: {e}", file=sys.stderr)
        return EXIT_SERVER_LOST
    finally:
        events.close()
    return EXIT_STOPPED


def cmd_queue(args: argparse.Namespace) -> int:
    """Run one of jobqueue's operator commands on the worker's DSN (the playground's)."""
    from .worker import worker_dsn

    args.dsn = worker_dsn(args.dsn)
    return int(args.ops(args))


def cmd_enqueue(args: argparse.Namespace) -> int:
    from . import queue
    from .worker import worker_dsn

    with db.connect(worker_dsn(args.dsn), "enqueue", autocommit=True) as conn:
        ids = queue.enqueue(conn, args.kind, tenant=args.tenant, count=args.count,
                            seconds=args.seconds, max_attempts=args.max_attempts)
    span = f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"
    print(f"queued {len(ids)} {args.kind} job{'s' if len(ids) != 1 else ''}: id {span}")
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    from jobqueue import EXIT_SERVER_LOST, ServerLost
    from jobqueue import cli as jobqueue_cli

    from .events import EventLog
    from .worker import worker_dsn

    args.dsn = worker_dsn(args.dsn)
    try:
        return jobqueue_cli.cmd_reap(args, events=EventLog("reaper"))
    except ServerLost as e:
        print(f"tenantlab reap: {e}", file=sys.stderr)
        return EXIT_SERVER_LOST


def cmd_export_worker(args: argparse.Namespace) -> int:
    from .export import export

    try:
        dest = export(args.dir, args.name, force=args.force)
    except ValueError as e:  # a bad name, or a target holding files no export wrote
        print(f"tenantlab export-worker: {e}", file=sys.stderr)
        return 2
    print(f"wrote {dest} (read {dest / 'README.md'})", file=sys.stderr)
    # Last line: the command that starts the exported worker (nothing else on PYTHONPATH needed).
    print(f"PYTHONPATH={Path(args.dir).resolve()} python -m {args.name} --dsn DSN")
    return 0


# --- exercises: list, check, starter, solution (a contract: tests and participants rely on it) --

def add_exercise_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``tenantlab exercises list|check|starter|solution``."""
    ex = sub.add_parser("exercises", help="your turn: check your own fix against the failure")
    cmds = ex.add_subparsers(dest="exercise_command", required=True, metavar="ACTION")
    ls = cmds.add_parser("list", help="the exercises: id, notebook, title")
    ls.add_argument("--json", action="store_true", help="as a JSON list")
    ls.set_defaults(func=cmd_exercises_list)
    ck = cmds.add_parser("check", help="run the finding's scenario with your answer; exit 0 "
                                       "when it does it, 1 when not yet, 2 when it could not "
                                       "be checked")
    ck.add_argument("id", metavar="ID", help="the exercise (id or notebook number)")
    ck.add_argument("--answer", required=True, metavar="FILE", help="your answer's SQL (- : stdin)")
    ck.add_argument("--json", action="store_true",
                    help='print {"id", "correct", "checks": [...], "nudge", "checked"}')
    ck.set_defaults(func=cmd_exercises_check)
    for name, what in (("starter", "the naive version, runnable as is"),
                       ("solution", "the kit's answer")):
        p = cmds.add_parser(name, help=f"print {what}")
        p.add_argument("id", metavar="ID", help="the exercise (id or notebook number)")
        p.set_defaults(func=cmd_exercises_text, text=name)


def _exercise(key: str) -> Any:
    """Return the exercise, or None after saying which ids are valid (exit status 2)."""
    from . import exercises

    try:
        return exercises.get(key)
    except KeyError as e:
        print(f"tenantlab exercises: {e.args[0]}", file=sys.stderr)
        return None


def cmd_exercises_list(args: argparse.Namespace) -> int:
    import json

    from .exercises import EXERCISES

    rows = [{"id": e.id, "notebook": e.notebook, "title": e.title} for e in EXERCISES.values()]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{r['id']:<16} {r['notebook']}  {r['title']}")
    return 0


def cmd_exercises_check(args: argparse.Namespace) -> int:
    import json

    from .exercises import _core

    ex = _exercise(args.id)
    if ex is None:
        return 2
    try:
        text = _core.decode_answer(_read_answer(args.answer))
    except _core.Unusable as e:
        print(f"tenantlab exercises: could not check: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"tenantlab exercises: could not check: cannot read the answer {args.answer}: "
              f"{e.strerror or e}", file=sys.stderr)
        return 2
    try:
        outcome = ex.check(text)
    except Exception as e:  # no server, no rights: not "not yet" (1), which a script reads
        if (message := explain(e)) is None or args.debug:
            raise
        print(f"tenantlab exercises: {message}", file=sys.stderr)
        return 2
    print(json.dumps(outcome.to_json(), indent=1) if args.json else outcome.line())
    if not outcome.checked:
        return 2
    return 0 if outcome.correct else 1


def _read_answer(path: str) -> bytes:
    """Return an answer file's bytes (``-``: standard input), at most one byte over the limit."""
    from .exercises._core import MAX_ANSWER_BYTES

    if path == "-":
        if sys.stdin.isatty():
            print("tenantlab exercises: reading your answer from standard input; end it with "
                  "Ctrl-D (or pass --answer FILE)", file=sys.stderr)
        return sys.stdin.buffer.read(MAX_ANSWER_BYTES + 1)
    with open(path, "rb") as f:
        return f.read(MAX_ANSWER_BYTES + 1)


def cmd_exercises_text(args: argparse.Namespace) -> int:
    ex = _exercise(args.id)
    if ex is None:
        return 2
    print((ex.starter if args.text == "starter" else ex.answer).rstrip("\n"))
    return 0
