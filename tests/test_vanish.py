"""Finding vanish: the silent proxy, what the server keeps for a vanished worker, and notebook 10.

Behaviour, not timing: who holds what (locks, the horizon), who took the job over, the fenced
late finish, the outside world's calls; which timers end the backend at all. And nothing left
behind: no proxy thread or socket, no worker process, no namespace, no throwaway cluster.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psycopg
import pytest

from notebooks import run_clean
from tenantlab import db, finding
from tenantlab.experiments import _cluster, _netns, _tcp, vanish
from tenantlab.netproxy import Proxy

pytestmark = pytest.mark.slow

REQUIRED = {"server_noticed_s", "held_locks_while_vanished", "horizon_held",
            "taken_over_after_s", "late_finish_fenced", "outside_executions"}


def children() -> list[int]:
    """Return the pids of this process's live children (zombies reaped by Popen don't count)."""
    me, out = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def proxy_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("netproxy:")]


def assert_nothing_left(admin_dsn: str) -> None:
    assert proxy_threads() == []
    assert children() == [], "a worker or probe process was left running"
    assert _netns.leftovers() == []
    assert _cluster.leftovers() == []
    mine = f"_{os.getpid()}_"
    assert [b for b in db.leftover_backends(admin_dsn) if mine in (b["datname"] or "")] == []


def test_proxy_forwards_goes_silent_and_comes_back(scratch: db.Scratch) -> None:
    port = int(psycopg.conninfo.conninfo_to_dict(scratch.worker)["port"])
    with Proxy(port) as px:
        via = psycopg.conninfo.make_conninfo(scratch.worker, host="127.0.0.1", port=px.port)
        with psycopg.connect(via, autocommit=True) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            px.silence(0.5)  # bounded: it comes back by itself
            assert px.silent
            assert conn.execute("select 2").fetchone() == (2,)  # waited, then went through
            assert not px.silent
            assert px.silences and px.silences[0][1] is not None
        assert px.connections == 1
    assert not px.alive and px.open_sockets() == 0
    assert proxy_threads() == []


def test_proxy_is_stopped_on_keyboard_interrupt(scratch: db.Scratch) -> None:
    port = int(psycopg.conninfo.conninfo_to_dict(scratch.worker)["port"])
    with pytest.raises(KeyboardInterrupt):
        with Proxy(port) as px:
            px.silence()
            raise KeyboardInterrupt
    assert not px.alive and px.open_sockets() == 0


def test_kernel_defaults_are_computed_from_the_kernel() -> None:
    d = _tcp.kernel_defaults()
    ka = [int(Path(f"/proc/sys/net/ipv4/{n}").read_text()) for n in
          ("tcp_keepalive_time", "tcp_keepalive_intvl", "tcp_keepalive_probes")]
    assert d["idle in transaction (kernel keepalive defaults)"] == ka[0] + ka[1] * ka[2]
    if int(Path("/proc/sys/net/ipv4/tcp_retries2").read_text()) == 15:
        assert d["a result in flight (tcp_retries2)"] == 924.6


def test_vanished_worker_holds_the_horizon_is_taken_over_and_fenced(admin_dsn: str) -> None:
    res = vanish.run()
    m = res.measured
    assert REQUIRED <= set(m)
    assert m["backend_state_while_vanished"] == "idle in transaction"
    assert m["held_locks_while_vanished"] and m["migration_blocked"]
    assert m["horizon_held"]
    assert m["taken_over_after_s"] is not None
    assert m["late_finish_fenced"]
    assert m["outside_executions"] == 2  # the vanished worker's call and the new owner's
    # Through the proxy the server's keepalives notice nothing; the session timer does.
    assert m["proxy"]["server_noticed_through_proxy"] is False
    assert m["server_noticed_s"][vanish.IDLE_TIMEOUT] is not None
    # That timer starts at the session's last statement, before the cut: read on the server.
    assert m["idle_timeout_after_last_statement_s"] is not None
    f = m["sigstop"]
    assert f["late_finish_fenced"] and f["outside_executions"] == 2 and not f["server_noticed"]
    assert f["late_call_after_owner_s"] is not None and f["late_call_after_owner_s"] > 0
    noticed = m["server_noticed_s"]
    names = [p.setting for p in _tcp.probes(1, 1, 2, 2.0)]
    if _netns.available() is None:
        assert m["packets_dropped"].startswith("measured")
        assert noticed[names[0]] is not None  # server keepalives
        assert noticed[names[1]] is not None  # tcp_user_timeout, a result in flight
        assert noticed[names[2]] is None  # tcp_user_timeout alone: an idle backend stays
        assert noticed[names[3]] is None and noticed[names[4]] is None  # client-side settings
        assert all(v is not None for v in m["worker_noticed_s"].values())
    else:
        assert m["packets_dropped"].startswith("not measured")
        assert all(noticed[n] is None for n in names)  # never faked
    assert noticed["kernel defaults"] is None  # computed, never waited for
    # Behaviour, not timing: every check but those comparing a time with its setting.
    untimed = [c for c in res.verdict.checks if not c.timing]
    assert all(c.ok for c in untimed), res.verdict.line()
    assert {c.name for c in res.verdict.checks if c.timing} <= set(vanish.TIMED)
    assert vanish.judge(m, res.knobs) == res.verdict  # a verdict from the measured values alone
    assert len(vanish.script(res, "proxy")) >= 6
    assert_nothing_left(admin_dsn)


class Interrupt:
    """A live chart that interrupts the run after a few redraws, as the stop button would."""

    def __init__(self, after: int) -> None:
        self.after, self.updates = after, 0

    def update(self, data: object) -> None:
        self.updates += 1
        if self.updates >= self.after:
            raise KeyboardInterrupt


def test_an_interrupted_run_leaves_nothing_behind(admin_dsn: str) -> None:
    # The tcp part runs beside the proxy run: its namespace and cluster go too.
    with pytest.raises(KeyboardInterrupt):
        vanish.run(vanish.Knobs.of(parts=("proxy", "tcp")), live=Interrupt(5))
    assert_nothing_left(admin_dsn)


def test_no_namespace_here_means_not_measured_never_made_up(monkeypatch) -> None:
    monkeypatch.setattr(_netns, "available", lambda: "making a network namespace needs root")
    res = vanish.run(vanish.Knobs.of(parts=("tcp",)))
    m = res.measured
    assert m["packets_dropped"] == "not measured here: making a network namespace needs root"
    assert all(v is None for k, v in m["server_noticed_s"].items())
    assert m["default_extrapolated_s"]["idle in transaction (kernel keepalive defaults)"] > 0
    assert not res.verdict.valid  # says so: a check fails, naming why


@pytest.mark.notebook
def test_notebook_10_runs_top_to_bottom(admin_dsn: str) -> None:
    nb, text = run_clean("10-a-worker-vanishes.ipynb", admin_dsn)
    assert text.count("✓ as the expectation says") >= 2, text[-3000:]
    assert_nothing_left(admin_dsn)


def test_idle_timeout_is_judged_from_the_last_statement() -> None:
    m = {"settings": {"idle_timeout": 2.0, "lease": 2.0, "heartbeat": 0.5, "vanished_for": 5.0},
         "server_noticed_s": {vanish.IDLE_TIMEOUT: 1.72}, "packets_dropped": vanish.NOT_RUN,
         "idle_timeout_after_last_statement_s": 2.01, "idle_timeout_resolution_s": 0.03,
         "proxy": {"server_noticed_through_proxy": False}, "held_locks_while_vanished": True,
         "horizon_held": True, "taken_over_after_s": 2.1, "late_finish_fenced": True,
         "outside_executions": 2}

    def idle(measured: dict) -> finding.Check:
        return next(c for c in vanish.judge(measured).checks if c.name == vanish.IDLE_TIMEOUT)

    c = idle(m)
    assert c.ok and c.timing and c.expected == "ends it 2 s after its last statement"
    assert c.measured.startswith("2.01 s after its last statement") and "1.7 s after the cut" \
        in c.measured
    # Ended before its setting, or never: the check fails.
    assert not idle({**m, "idle_timeout_after_last_statement_s": 1.5}).ok
    assert not idle({**m, "idle_timeout_after_last_statement_s": None}).ok
    # A run stored before the last statement was read is judged from the cut, and says so.
    old = {k: v for k, v in m.items() if not k.startswith("idle_timeout_")}
    assert idle(old).ok and idle(old).expected == "ends it within 2 s of the cut"
