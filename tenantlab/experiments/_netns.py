"""A worker's network that really goes dark: a network namespace whose link is cut.

A userspace proxy that goes silent cannot make the server's TCP keepalives or
``tcp_user_timeout`` fire (its kernel still ACKs). Here the kernel drops the packets: the
client runs in a network namespace of its own, joined to the server's by a veth pair;
``link.cut()`` sets the pair down, and whatever the server sends towards the client is dropped
(no FIN, no RST, no ACK), as for a pulled cable or a dead node. Everything stays on this
machine: link-local addresses (169.254.x.1 for the server, .2 for the client) on the project's
own veth pair, in a namespace made here and deleted on the way out, also on Ctrl-C.

Needs root and iproute2 (``ip netns``, ``ip link``); ``available()`` says why not otherwise,
and the finding reports those settings as not measured.

``python -m tenantlab.experiments._netns MODE`` is the probe that runs inside the namespace
(``ip netns exec``): it connects with ``TENANTLAB_PROBE_DSN``, claims a job and opens the
work's transaction with the worker's own statements, prints ``ready <backend pid>``, waits for
``go`` on stdin, then does what MODE says and prints ``error <time>`` when its connection fails:
``hold`` stays idle in its transaction; ``result`` runs a 0.5 s query whose result arrives
after the cut; ``query`` sends a query after the cut; ``listen`` waits for a NOTIFY.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

PREFIX = "tlvanish"
MODES = ("hold", "result", "query", "listen")


class NetnsError(RuntimeError):
    """The namespace or its link could not be made here."""


@dataclass
class Link:
    """A namespace joined to this one by a veth pair; cut() drops every packet both ways."""

    ns: str
    host_if: str
    host_addr: str
    peer_addr: str
    cut_at: float | None = None

    def cut(self) -> float:
        """Set the link down on both ends: packets are dropped from now on. Return the time."""
        _ip("link", "set", self.host_if, "down")
        _ip("-n", self.ns, "link", "set", "veth0", "down")
        self.cut_at = time.time()
        return self.cut_at

    def restore(self) -> None:
        _ip("-n", self.ns, "link", "set", "veth0", "up")
        _ip("link", "set", self.host_if, "up")

    def command(self, argv: list[str]) -> list[str]:
        """Return argv run inside the namespace."""
        return ["ip", "netns", "exec", self.ns, *argv]


def available() -> str | None:
    """Return why a namespace cannot be made here, or None when it can."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "making a network namespace needs root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt install iproute2)"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def _free_subnet() -> int:
    taken = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for third in [*range(os.getpid() % 200 + 20, 250), *range(20, 250)]:
        if f"169.254.{third}." not in taken:
            return third
    raise NetnsError("no free 169.254.x.0/30 subnet for the namespace's link")


@contextmanager
def link(label: str = "") -> Iterator[Link]:
    """Make a namespace and a veth pair to it; delete both on the way out."""
    if why := available():
        raise NetnsError(why)
    tag = _tag(os.getpid())
    ns, host_if = f"{PREFIX}{tag}", f"tlv{tag}h"
    third = _free_subnet()
    host_addr, peer_addr = f"169.254.{third}.1", f"169.254.{third}.2"
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", "veth0", "netns", ns)
        _ip("addr", "add", f"{host_addr}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", ns, "addr", "add", f"{peer_addr}/30", "dev", "veth0")
        _ip("-n", ns, "link", "set", "veth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        yield Link(ns, host_if, host_addr, peer_addr)
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _tag(pid: int) -> str:
    return f"{pid % 100000}"  # interface names: at most 15 characters


def leftovers(pid: int | None = None) -> list[str]:
    """Return the namespaces a process (default: this one) left behind (none, normally)."""
    if available():
        return []
    tag = _tag(pid or os.getpid())
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [line.split()[0] for line in out.splitlines() if line.split()[0] == f"{PREFIX}{tag}"]
    link = subprocess.run(["ip", "link", "show", f"tlv{tag}h"], capture_output=True)
    return left + ([f"tlv{tag}h"] if link.returncode == 0 else [])


# -- the probe, inside the namespace ---------------------------------------------------------------

def _probe(mode: str) -> int:
    import psycopg
    from jobqueue.queries import q as production_q

    from .. import kinds, settings
    from ..queries import q

    dsn = settings.probe_dsn() or ""
    try:
        conn = psycopg.connect(dsn, autocommit=True, application_name=f"tenantlab probe {mode}")
        if mode == "listen":
            conn.execute(production_q("listen"))
        else:
            row = conn.execute(production_q("claim_leased"), {
                "lease": 600, "batch": 1, "kinds": sorted(kinds.handlers),
                "queues": ["default"]}).fetchone()
            if row is None:
                print("error no job to claim", flush=True)
                return 1
            conn.autocommit = False
            # A job that has written (its job_runs row, as the single-transaction worker writes
            # it at the start): an xid and row locks, held until the transaction ends.
            conn.execute(q("start_run_single"), {"id": row[0], "worker": f"probe {mode}",
                                                 "attempt": row[2], "tenant": str(row[1])})
        print(f"ready {conn.info.backend_pid}", flush=True)
        sys.stdin.readline()  # "go"
        if mode == "result":
            conn.execute(q("vanish_work_on_server"), {"seconds": 0.5})
        elif mode == "query":
            time.sleep(0.3)  # after the cut
            conn.execute(q("vanish_work_on_server"), {"seconds": 0.0})
        elif mode == "listen":
            for _ in conn.notifies():
                pass
        time.sleep(3600)  # hold: idle in transaction until ended
    except psycopg.Error as e:
        print(f"error {time.time()} {str(e).strip().splitlines()[0] if str(e) else e}",
              flush=True)
        return 0
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in MODES:
        print(f"usage: python -m {__spec__.name if __spec__ else '_netns'} "
              f"{{{','.join(MODES)}}}", file=sys.stderr)
        sys.exit(2)
    sys.exit(_probe(sys.argv[1]))
