"""How long until a vanished client is noticed, per TCP setting, with packets really dropped.

Probe clients (tenantlab/experiments/_netns.py) run in a network namespace and connect to a
throwaway cluster (tenantlab/experiments/_cluster.py) over a veth link, each with one setting;
each claims a job and opens the work's transaction with the worker's own statements. Then the
link is cut and, from this side, the server's view is sampled every 0.1 s: a backend that is
gone was noticed. The probes also say when *their* connection failed (the worker's side).
Settings are short (1-2 s) so the run takes seconds; the kernel's defaults are not waited
for but computed from its settings, the same sums the short runs confirm.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo

from .. import db, queue
from ..queries import q
from . import _cluster, _netns


@dataclass(frozen=True)
class Probe:
    """One client in the namespace: its setting's name, what it does, and how it connects."""

    setting: str
    mode: str
    server_options: str = ""  # -c ... for the backend (PGOPTIONS / conninfo options)
    client: dict[str, Any] = field(default_factory=dict)  # libpq conninfo parameters
    expect_server: bool = True  # whether the server is expected to notice within the bound
    expect_client: bool = False  # whether the probe's own connection is expected to fail


def probes(keepalive_idle: float, keepalive_interval: float, keepalive_count: int,
           user_timeout: float) -> list[Probe]:
    """Return the probes for these settings: server-side, then client-side."""
    ka = (f"-c tcp_keepalives_idle={keepalive_idle:g} "
          f"-c tcp_keepalives_interval={keepalive_interval:g} "
          f"-c tcp_keepalives_count={keepalive_count}")
    ut = f"-c tcp_user_timeout={int(user_timeout * 1000)}"
    return [
        Probe("tcp_keepalives_idle/interval/count (server)", "hold", ka),
        Probe("tcp_user_timeout (server), a result in flight", "result", ut),
        Probe("tcp_user_timeout (server), idle in transaction", "hold", ut, expect_server=False),
        Probe("keepalives (client conninfo)", "listen",
              client={"keepalives": 1, "keepalives_idle": int(max(1, keepalive_idle)),
                      "keepalives_interval": int(max(1, keepalive_interval)),
                      "keepalives_count": keepalive_count},
              expect_server=False, expect_client=True),
        Probe("tcp_user_timeout (client conninfo)", "query",
              client={"tcp_user_timeout": int(user_timeout * 1000)},
              expect_server=False, expect_client=True),
    ]


def kernel_defaults() -> dict[str, float | None]:
    """Return what the kernel's defaults imply, in seconds (None where unreadable).

    Idle: the first keepalive probe after ``tcp_keepalive_time``, then ``tcp_keepalive_probes``
    unanswered probes ``tcp_keepalive_intvl`` apart. Data in flight: ``tcp_retries2``
    retransmissions with the RTO doubling from 200 ms up to its 120 s cap (Linux's
    ``tcp_model_timeout``).
    """
    def read(name: str) -> int | None:
        try:
            return int(Path(f"/proc/sys/net/ipv4/{name}").read_text())
        except (OSError, ValueError):
            return None

    ka_time, ka_intvl, ka_probes = (read(n) for n in ("tcp_keepalive_time", "tcp_keepalive_intvl",
                                                      "tcp_keepalive_probes"))
    retries = read("tcp_retries2")
    idle = None if None in (ka_time, ka_intvl, ka_probes) else \
        float(ka_time + ka_intvl * ka_probes)  # type: ignore[operator]
    inflight = None
    if retries is not None:
        rto_min, rto_max, thresh = 0.2, 120.0, 9  # ilog2(120 / 0.2)
        inflight = ((2 << min(retries, thresh)) - 1) * rto_min + \
            max(0, retries - thresh) * rto_max
    return {"idle in transaction (kernel keepalive defaults)": idle,
            "a result in flight (tcp_retries2)": None if inflight is None else round(inflight, 1)}


@dataclass
class Outcome:
    """What one cut showed: per setting, when the server and the probe noticed (None: not)."""

    server_noticed_s: dict[str, float | None]
    worker_noticed_s: dict[str, float | None]
    bound_s: float
    samples: list[dict[str, Any]]
    states: dict[str, str]


def measure(settings: list[Probe], bound: float, label: str = "vanish") -> Outcome:
    """Cut a namespace's link under the probes; return when each side noticed, within `bound`."""
    with _netns.link(label) as link, _cluster.cluster(label, listen=link.host_addr) as c, \
            db.scratch(label, c.dsn) as s:
        with s.connect("worker", f"{label} enqueue", autocommit=True) as conn:
            queue.enqueue(conn, "sleep", count=len(settings), seconds=0.0)
        base = make_conninfo(s.worker, host=link.host_addr, connect_timeout=10)
        procs: list[subprocess.Popen] = []
        try:
            for p in settings:
                params: dict[str, Any] = dict(p.client)
                if p.server_options:
                    params["options"] = p.server_options
                env = dict(os.environ, TENANTLAB_PROBE_DSN=make_conninfo(base, **params))
                procs.append(subprocess.Popen(
                    link.command([sys.executable, "-m", "tenantlab.experiments._netns", p.mode]),
                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            return _cut_and_watch(link, c.dsn, settings, procs, bound)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                for stream in (proc.stdin, proc.stdout):
                    if stream is not None:
                        stream.close()


def _cut_and_watch(link: _netns.Link, dsn: str, settings: list[Probe],
                   procs: list[subprocess.Popen], bound: float) -> Outcome:
    pids: dict[str, int] = {}
    for p, proc in zip(settings, procs, strict=True):
        line = _readline(proc, 30.0)
        if not line.startswith("ready "):
            raise _netns.NetnsError(f"probe {p.setting!r} did not start: {line.strip()!r}")
        pids[p.setting] = int(line.split()[1])
    failed: dict[str, str] = {}
    for p, proc in zip(settings, procs, strict=True):
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        threading.Thread(target=lambda s=p.setting, pr=proc: failed.__setitem__(
            s, _readline(pr, bound + 30)), daemon=True).start()
    time.sleep(0.1)  # the "result" probe's query is on the server when the link goes
    cut = link.cut()
    gone: dict[str, float] = {}
    samples: list[dict[str, Any]] = []
    states: dict[str, str] = {}
    with db.connect(dsn, "vanish watch", autocommit=True) as admin:
        while time.time() - cut < bound:
            rows = {r[0]: r for r in admin.execute(q("vanish_backends"),
                                                   {"pids": list(pids.values())})}
            now = time.time() - cut
            for name, pid in pids.items():
                if pid in rows:
                    states.setdefault(name, rows[pid][1])
                    samples.append({"t": now, "setting": name, "state": rows[pid][1]})
                elif name not in gone:
                    gone[name] = round(now, 2)
            expected = [p.setting for p in settings if p.expect_server]
            clients = [p.setting for p in settings if p.expect_client]
            if all(n in gone for n in expected) and all(n in failed for n in clients) and \
                    now > max([*gone.values(), 0.0]) + 1.0:
                break  # the rest are not expected within any bound we would wait for
            time.sleep(0.1)
        waited = time.time() - cut
    worker: dict[str, float | None] = {}
    for p in settings:
        if p.mode in ("query", "listen"):
            text = failed.get(p.setting, "")
            worker[p.setting] = round(float(text.split()[1]) - cut, 2) \
                if text.startswith("error ") else None
    return Outcome({p.setting: gone.get(p.setting) for p in settings}, worker,
                   round(waited, 1), samples, states)


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """Return the probe's next line ('' if it says nothing within timeout)."""
    out: list[str] = []
    assert proc.stdout is not None
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    t.start()
    t.join(timeout)
    return out[0] if out else ""
