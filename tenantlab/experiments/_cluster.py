"""A throwaway PostgreSQL cluster of an experiment's own, so the shared server is never restarted.

``with cluster("restart") as c:`` runs ``initdb`` into a temporary directory with the same
binaries as the embedded server (tenantlab.server), starts it on a free port of 127.0.0.1 (and
on ``listen`` addresses, for a network namespace's link), builds the kit's template with the
same code as the lab's (``db.ensure_template``), and on the way out stops it and removes the
directory, also on Ctrl-C. ``c.crash_restart()`` is a power cut and a start: an immediate shutdown
(SIGQUIT, as ``pg_ctl stop -m immediate``: crash recovery at the next start), then ``pg_ctl
start``.

Restarting the lab's own server would cut every other notebook, test and session on it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .. import db
from ..errors import TenantlabError
from ..queries import q
from ..server import Server, alive, free_port

log = logging.getLogger("tenantlab")

PREFIX = "tenantlab-cluster-"


class ClusterError(TenantlabError):
    """The throwaway cluster could not be made here (no PostgreSQL binaries, say)."""


@dataclass
class Cluster:
    """One throwaway cluster: its server, port and admin DSN."""

    server: Server
    port: int

    @property
    def dsn(self) -> str:
        return self.server.dsn()

    def stop_immediate(self) -> float:
        """Stop as a power cut would (no checkpoint, backends killed); return when it happened.

        SIGQUIT to the postmaster is what ``pg_ctl stop -m immediate`` sends; sent directly it
        lands within a millisecond of the moment chosen (a claim just seen), not after
        pg_ctl's own start-up.
        """
        pid = self.server.pid()
        if pid is None:
            raise ClusterError(f"the throwaway cluster in {self.server.home} is not running")
        at = time.time()
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + 60
        pidfile = self.server.data / "postmaster.pid"
        # Done when it removed its pid file (as pg_ctl waits): a dead postmaster may stay a
        # zombie for a while, until whoever adopted it reaps it.
        while pidfile.exists() and alive(pid):
            if time.monotonic() > deadline:
                raise ClusterError(f"postmaster {pid} still running 60 s after SIGQUIT")
            time.sleep(0.01)
        return at

    def start(self) -> None:
        self.server.up(port=self.port)

    def crash_restart(self, down_for: float = 0.0) -> float:
        """Stop immediately, stay down `down_for` seconds, start; return the stop's time."""
        at = self.stop_immediate()
        time.sleep(down_for)
        self.start()
        return at


def available() -> str | None:
    """Return why no throwaway cluster can be made here, or None when one can."""
    try:
        from ..server import bindir

        bindir()
    except TenantlabError as e:
        return str(e)
    return None


@contextmanager
def cluster(label: str, listen: str = "") -> Iterator[Cluster]:
    """Start a throwaway cluster with the kit's template; stop and remove it on the way out.

    ``listen``: extra addresses to listen on besides 127.0.0.1 (a veth's address), allowed to
    log in by password from their /32.
    """
    if why := available():
        raise ClusterError(f"no throwaway cluster for {label}: {why}")
    home = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{label}-", dir="/tmp"))
    home.chmod(0o755)  # the server user (when we are root) must enter it
    server = Server(home, listen=",".join(["127.0.0.1", *filter(None, [listen])]))
    port = free_port()
    try:
        server.up(port=port)
        if listen:
            _allow(server, listen)
        db.ensure_template(server.dsn())
        yield Cluster(server, port)
    finally:
        try:
            server.down()
        except Exception as e:  # the directory goes anyway; say why the stop failed
            log.warning("throwaway cluster %s did not stop cleanly: %s", home, e)
            _kill(server)
        shutil.rmtree(home, ignore_errors=True)


def _allow(server: Server, address: str) -> None:
    """Let the kit's roles log in by password from `address` (a veth peer), and reload."""
    hba = server.data / "pg_hba.conf"
    with hba.open("a") as f:
        f.write(f"host all all {address.rsplit('.', 1)[0]}.0/24 scram-sha-256\n")
    with db.connect(server.dsn(), "cluster", autocommit=True) as conn:
        conn.execute(q("cluster_reload_conf"))


def _kill(server: Server) -> None:
    pid = server.pid()
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGQUIT)  # the postmaster's immediate shutdown
    except ProcessLookupError:
        pass


def leftovers(pid: int | None = None) -> list[Path]:
    """Return the throwaway cluster directories a process (default: this one) left on disk."""
    return sorted(Path("/tmp").glob(f"{PREFIX}{pid or os.getpid()}-*"))
