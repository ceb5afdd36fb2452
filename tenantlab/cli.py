"""The ``tenantlab`` command: the embedded server, the lab, and ``reproduce``."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

from . import db, pgbouncer, reproduce, worker
from .experiments import FINDINGS
from .server import REPO, ServerError, embedded

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
    if pgbouncer.stop_daemon():
        print("stopped PgBouncer")
    if args.purge:
        server.purge()
        print(f"stopped and removed {server.home}")
    else:
        print("stopped" if server.down() else "not running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if url := os.environ.get("DATABASE_URL"):
        print(f"using DATABASE_URL: PostgreSQL {db.server_version(url)}")
        return 0
    st = embedded().status()
    if not st["running"]:
        print(f"not running (state in {st['home']}): start it with `tenantlab up`")
        return 1
    print(f"running: pid {st['pid']}, port {st['port']}, "
          f"PostgreSQL {db.server_version()}, state in {st['home']}")
    print(embedded().dsn())
    return 0


def notebooks_dir() -> Path:
    if env := os.environ.get("TENANTLAB_NOTEBOOKS"):
        return Path(env)
    for candidate in (REPO / "notebooks", Path.cwd() / "notebooks"):
        if candidate.is_dir():
            return candidate
    raise ServerError("no notebooks/ directory found: run from the checkout or set TENANTLAB_NOTEBOOKS")


def cmd_lab(args: argparse.Namespace) -> int:
    nbdir = notebooks_dir()
    token = args.token or os.environ.get("JUPYTER_TOKEN") or secrets.token_hex(16)
    with db.server_session(port=args.db_port) as dsn:
        db.ensure_template(dsn)
        env = dict(os.environ, TENANTLAB_HOME=str(embedded().home), JUPYTER_TOKEN=token)
        cmd = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={nbdir}",
               f"--ServerApp.ip={args.ip}", f"--ServerApp.port={args.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}"]
        if args.no_browser:
            cmd.append("--no-browser")
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        print(f"JupyterLab: http://{args.ip}:{args.port}/lab?token={token}", file=sys.stderr)
        # Its own session: a Ctrl-C reaches us, and we stop Jupyter before the server.
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        # Both, explicitly: a shell that starts us in the background ignores SIGINT, and Python
        # then never turns it into KeyboardInterrupt.
        signal.signal(signal.SIGTERM, _raise_interrupt)
        signal.signal(signal.SIGINT, _raise_interrupt)
        try:
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


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cmd_reproduce(args: argparse.Namespace) -> int:
    unknown = [i for i in args.ids if i not in FINDINGS]
    if unknown:
        valid = ", ".join(FINDINGS) or "none registered yet"
        print(f"tenantlab reproduce: unknown finding {', '.join(unknown)}; valid ids: {valid}",
              file=sys.stderr)
        return 2
    result = reproduce.run(args.ids, full=args.full)
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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tenantlab", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start the embedded PostgreSQL 17; print the admin DSN last")
    up.add_argument("--port", type=_port, default=None,
                    help="TCP port on 127.0.0.1 (default: the last one, else 54317 or a free one)")
    up.add_argument("--pgbouncer", action="store_true",
                    help="also start PgBouncer in transaction mode in front of it (notebook 12)")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop the embedded server")
    down.add_argument("--purge", action="store_true", help="also remove its data directory")
    down.set_defaults(func=cmd_down)

    sub.add_parser("status", help="is the server running, and where").set_defaults(func=cmd_status)

    lab = sub.add_parser("lab", help="start the server (unless DATABASE_URL) and JupyterLab")
    lab.add_argument("--port", type=_port, default=8888, help="JupyterLab's port (default 8888)")
    lab.add_argument("--ip", default="127.0.0.1", help="address JupyterLab listens on")
    lab.add_argument("--db-port", type=_port, default=None, help="the embedded server's port")
    lab.add_argument("--token", default=None, help="Jupyter token (default: random, printed)")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser")
    lab.set_defaults(func=cmd_lab)

    rep = sub.add_parser("reproduce", help="regenerate the article's findings on this server")
    rep.add_argument("ids", nargs="*", metavar="ID",
                     help=f"finding ids (default: all): {', '.join(FINDINGS) or 'none yet'}")
    rep.add_argument("--full", action="store_true", help="the article's sizes (slower)")
    rep.add_argument("--json", metavar="FILE", help="write the results as JSON")
    rep.add_argument("--report", metavar="FILE",
                     help="write one HTML page with claims, measurements, verdicts and charts")
    rep.set_defaults(func=cmd_reproduce)

    worker.add_arguments(sub)  # worker, enqueue, reap
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="tenantlab: %(message)s")
    try:
        return args.func(args)
    except ServerError as e:
        print(f"tenantlab {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
