"""One worker vanishes mid-job while another waits: through a silent proxy, or frozen (SIGSTOP).

Worker A (``tenantlab worker --design leased --max-jobs 1``) claims an ``outside`` job that
writes first (a ``job_writes`` row: an xid and a lock on the table, as any handler that writes
takes; one that does not write holds neither). Then A vanishes:

- ``proxy``: A reaches the server through tenantlab/netproxy.py, which goes silent both ways;
  A's process lives on, finishes its work, calls the outside world, and its finish waits in the
  proxy until the network comes back;
- ``sigstop``: A's whole process is frozen (a paused VM, a laptop lid), and continued later.

Worker B, direct, polls every 0.1 s and takes the job over once A's lease expired (A's
heartbeat cannot reach the server either). Meanwhile the server's view of A's backend is
sampled every 0.2 s (state, xid, locks held), with the horizon monitor (tenantlab/monitor.py)
and a migration's lock attempt; in the proxy run a second vanished session, with
``idle_in_transaction_session_timeout`` set, shows that timer ending it: its last statement
(``pg_stat_activity.state_change``) and the moment it is gone are read every 20 ms on the
server's clock, so the timer is measured from where it starts, the last statement (about
0.3 s before the cut), not from the cut.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any

import pandas as pd
import psycopg
from psycopg.conninfo import make_conninfo

from .. import db, monitor, outside, queue
from .. import events as eventlog
from ..netproxy import Proxy
from ..queries import q
from ..settings import OUTSIDE
from ._workers import WorkersRun, command, workers_run

TENANT = 7


def _start(run: WorkersRun, dsn: str, env: dict[str, str], **options: Any) -> subprocess.Popen:
    """Start a worker with its own DSN (one through the proxy); the fleet still ends it."""
    proc = subprocess.Popen(command(events=run.path, **options),
                            env=dict(run.fleet.env, TENANTLAB_DSN=dsn, **env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run.fleet.procs.append(proc)
    return proc


def _first(evs: list[dict[str, Any]], worker: str, event: str) -> dict[str, Any] | None:
    return next((e for e in evs if e["worker"] == worker and e["event"] == event), None)


def vanish(how: str, *, lease: float, heartbeat: float, job: float, vanished_for: float,
           idle_timeout: float, keepalive: tuple[int, int, int], live: Any = None,
           ) -> dict[str, Any]:
    """Run one vanish (`how`: 'proxy' or 'sigstop'); return its facts and samples."""
    if how not in ("proxy", "sigstop"):
        raise ValueError(f"how must be 'proxy' or 'sigstop', not {how!r}")
    opts = {"design": "leased", "lease": lease, "heartbeat": heartbeat, "poll": 0.1,
            "max_jobs": 1, "backoff": 0.0}
    idle, interval, count = keepalive
    server_ka = (f"-c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={interval} "
                 f"-c tcp_keepalives_count={count}")
    with workers_run(f"vanish {how}") as run:
        outside_file = run.path.with_name("outside.jsonl")
        env = {OUTSIDE: str(outside_file)}
        with run.scratch.connect("worker", "vanish enqueue", autocommit=True) as conn:
            queue.enqueue(conn, "outside", tenant=TENANT, seconds=job, max_attempts=3,
                          write=True)
        where = psycopg.conninfo.conninfo_to_dict(run.scratch.worker)
        port = int(str(where.get("port") or 5432))
        host = str(where.get("host") or "127.0.0.1")  # a compose service name works too
        upstream = "127.0.0.1" if host.startswith("/") else host
        with Proxy(port, upstream, max_silence=vanished_for + 30,
                   lifetime=vanished_for + 120) as px, \
                monitor.Monitor(run.scratch.admin) as mon:
            via = make_conninfo(run.scratch.worker, host="127.0.0.1", port=px.port,
                                options=server_ka) if how == "proxy" else run.scratch.worker
            a = _start(run, via, env, name="A", **opts)
            run.until(lambda: _first(eventlog.read(run.path), "A", "execute") is not None, 30)
            a_pid = _backend(run, "A")
            holder, ended = None, None
            try:
                if how == "proxy":
                    # A second vanished session: the timer inside PostgreSQL that does end it.
                    holder = monitor.Holder(make_conninfo(via, options=None), "xid",
                                            idle_timeout=idle_timeout).open()
                    ended = IdleEnd(run.scratch.admin, holder.pid, vanished_for + 5)
                time.sleep(0.3)  # A is in its work now
                if how == "proxy":
                    px.silence(vanished_for + 5)  # resumed below; the bound is for an interrupt
                else:
                    os.kill(a.pid, signal.SIGSTOP)
                gone_at = back_at = time.time()
                b = _start(run, run.scratch.worker, env, name="B", **opts)
                try:
                    samples, blocked, holder_gone = _watch(run, mon, a_pid, holder, gone_at,
                                                           vanished_for, live)
                finally:
                    if how == "sigstop":
                        os.kill(a.pid, signal.SIGCONT)  # never leave a frozen process behind
                    px.resume()
                    back_at = time.time()
                run.wait(a, timeout=job + lease + 30)
                # B may never have got the job (A came back within its lease): stop it then.
                run.until(lambda: b.poll() is not None or _done(run), job + lease + 30)
                run.stop(b)
            finally:
                if ended is not None:
                    ended.stop()
                if holder is not None:
                    holder.release()
        with run.scratch.connect("admin", "vanish result", autocommit=True) as conn:
            runs = conn.execute(q("job_runs_of"), {"id": 1}).fetchall()
            state = queue.job_states(conn)[0]
        evs = eventlog.read(run.path)
        calls = outside.read(outside_file)
    return _facts(how, evs, calls, runs, state, samples, blocked, gone_at, back_at, a_pid,
                  holder_gone, px.connections, ended.result() if ended else {})


class IdleEnd:
    """Watch one session until it ends: its last statement and its end, on the server's clock.

    A thread polls every ``every`` seconds (``vanish_state_change``): while the backend is
    there, its ``state_change`` (the end of its last statement); the first poll without it is
    when it was gone. ``result()``: seconds from the last statement to the end, and the poll's
    resolution (the end lies between the last poll that saw it and that first poll without it).
    """

    def __init__(self, admin_dsn: str, pid: int | None, bound: float, every: float = 0.02
                 ) -> None:
        self.pid, self.bound, self.every = pid, bound, every
        self.last_statement: float | None = None
        self.last_seen: float | None = None
        self.gone: float | None = None
        self._stop = threading.Event()
        self._conn = db.connect(admin_dsn, "vanish idle end", autocommit=True)
        self._thread = threading.Thread(target=self._poll, name="vanish-idle-end", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        deadline = time.monotonic() + self.bound
        while not self._stop.is_set() and time.monotonic() < deadline and self.pid is not None:
            row = self._conn.execute(q("vanish_state_change"), {"pid": self.pid}).fetchone()
            now, changed = row if row else (None, None)
            if changed is None:
                self.gone = now
                return
            self.last_statement, self.last_seen = changed, now
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._conn.close()

    def result(self) -> dict[str, float | None]:
        if self.gone is None or self.last_statement is None or self.last_seen is None:
            return {"after_last_statement_s": None, "resolution_s": None}
        return {"after_last_statement_s": round(self.gone - self.last_statement, 3),
                "resolution_s": round(self.gone - self.last_seen, 3)}


def _done(run: WorkersRun) -> bool:
    with run.scratch.connect("admin", "vanish done", autocommit=True) as conn:
        return bool(queue.job_states(conn)[0]["status"] == "done")


def _backend(run: WorkersRun, worker: str) -> int | None:
    with run.scratch.connect("admin", "vanish who", autocommit=True) as conn:
        row = conn.execute(q("vanish_backend_of"), {"name": f"jobqueue {worker}"}).fetchone()
    return int(row[0]) if row else None


def _watch(run: WorkersRun, mon: monitor.Monitor, a_pid: int | None,
           holder: monitor.Holder | None, gone_at: float, vanished_for: float, live: Any
           ) -> tuple[list[dict[str, Any]], bool | None, float | None]:
    """Sample the server's view of A every 0.2 s while A is gone; try a migration's lock once."""
    samples: list[dict[str, Any]] = []
    blocked: bool | None = None
    holder_gone: float | None = None
    pids = [p for p in (a_pid, holder.pid if holder else None) if p is not None]
    with run.scratch.connect("admin", "vanish watch", autocommit=True) as conn:
        while (now := time.time()) - gone_at < vanished_for:
            rows = {r[0]: r for r in conn.execute(q("vanish_backends"), {"pids": pids})}
            oldest = mon.sample().oldest()
            job = queue.job_states(conn)[0]
            a = rows.get(a_pid)
            samples.append({
                "t": now - gone_at, "a_state": a[1] if a else "gone",
                "a_xid": a[2] if a else None, "a_locks": int(a[4]) if a else 0,
                "horizon_holder": "A" if oldest and oldest["pid"] == a_pid else
                ("other" if oldest else "none"),
                "holder_state": ("gone" if holder and holder.pid not in rows else
                                 rows[holder.pid][1] if holder else None),
                "lease_left": (job["locked_until"].timestamp() - now)
                if job["locked_until"] is not None else None,
                "attempts": job["attempts"], "status": job["status"]})
            if holder is not None and holder.pid not in rows and holder_gone is None:
                holder_gone = now - gone_at
            if blocked is None and now - gone_at > 1.0:
                blocked = _migration_blocked(run)
            if live is not None:
                live.update(timeline(pd.DataFrame(samples), [
                    {**e, "t": e["t"] - gone_at} for e in eventlog.read(run.path)]))
            time.sleep(0.2)
    return samples, blocked, holder_gone


def _migration_blocked(run: WorkersRun) -> bool:
    """Return True when a migration could not take job_writes now (the vanished worker holds it)."""
    with run.scratch.connect("admin", "vanish migration") as conn:
        try:
            conn.execute(q("vanish_try_migration_lock"))
            return False
        except psycopg.errors.LockNotAvailable:
            return True
        finally:
            conn.rollback()


def _facts(how: str, evs: list[dict[str, Any]], calls: list[dict[str, Any]], runs: list[Any],
           state: dict[str, Any], samples: list[dict[str, Any]], blocked: bool | None,
           gone_at: float, back_at: float, a_pid: int | None, holder_gone: float | None,
           connections: int, ended: dict[str, float | None]) -> dict[str, Any]:
    b_claim = _first(evs, "B", "claim")
    b_done = _first(evs, "B", "finish")
    a_fenced = _first(evs, "A", "fenced")
    a_call = next((c for c in calls if c["worker"] == "A"), None)
    during = [s for s in samples if s["t"] > 0.2]
    facts = {
        "how": how,
        "backend_state": max((s["a_state"] for s in during), key=[s["a_state"] for s in during]
                             .count, default=None),
        "server_noticed": any(s["a_state"] == "gone" for s in during),
        "held_locks": bool(during) and all(s["a_locks"] > 0 for s in during),
        "held_xid": bool(during) and all(s["a_xid"] is not None for s in during),
        "horizon_held": bool(during) and all(s["horizon_holder"] == "A" for s in during),
        "migration_blocked": blocked,
        "taken_over_after_s": None if b_claim is None else round(b_claim["t"] - gone_at, 2),
        "owner_completed_after_s": None if b_done is None else round(b_done["t"] - gone_at, 2),
        "late_finish_fenced": a_fenced is not None and state["status"] == "done"
        and state["attempts"] == 2 and sum(1 for r in runs if r[3] is not None) == 1,
        "outside_executions": len(calls),
        "late_call_after_owner_s": None if (a_call is None or b_done is None) else
        round(a_call["t"] - b_done["t"], 2),
        "back_after_s": round(back_at - gone_at, 2),
        "job_status": state["status"], "job_attempts": state["attempts"],
        # From the cut (sampled every 0.2 s), and from the session's last statement, where the
        # timer starts (polled every 20 ms on the server's clock).
        "idle_timeout_noticed_s": None if holder_gone is None else round(holder_gone, 2),
        "idle_timeout_after_last_statement_s": ended.get("after_last_statement_s"),
        "idle_timeout_resolution_s": ended.get("resolution_s"),
        "a_pid": a_pid, "proxied_connections": connections,
    }
    rel = [{**e, "t": e["t"] - gone_at} for e in evs]
    return {"facts": facts, "samples": pd.DataFrame(samples), "events": rel,
            "calls": [{**c, "t": c["t"] - gone_at} for c in calls],
            "timeline": timeline(pd.DataFrame(samples), rel, facts["back_after_s"])}


LANES = ("worker A", "server: A's backend", "horizon", "the job's lease", "worker B",
         "another silent session")
EVENT_WORDS = {"claim": "claim", "outside": "outside-world call", "finish": "finish",
               "fenced": "late finish fenced", "lease-lost": "lease lost"}


def timeline(samples: pd.DataFrame, events: list[dict[str, Any]],
             back_after: float | None = None) -> pd.DataFrame:
    """Return the run as chart rows: lane, start, end, what (segments and events; t=0: A gone)."""
    rows: list[dict[str, Any]] = []
    records = samples.to_dict("records")
    for i, r in enumerate(records):
        # Each sample holds until the next one (the last for the sampling step).
        t = r["t"]
        step = (records[i + 1]["t"] - t) if i + 1 < len(records) else 0.2
        rows.append({"lane": "server: A's backend", "start": t, "end": t + step,
                     "what": f"A's backend: {r['a_state']}"})
        rows.append({"lane": "horizon", "start": t, "end": t + step,
                     "what": "horizon held by A" if r["horizon_holder"] == "A"
                     else "horizon: not A"})
        if r["status"] == "done":
            lease = "job done"
        elif r["attempts"] == 1:
            lease = ("lease of attempt 1 (A)" if (r["lease_left"] or 0) > 0
                     else "lease expired")
        else:
            lease = f"lease of attempt {r['attempts']} (B)"
        rows.append({"lane": "the job's lease", "start": t, "end": t + step, "what": lease})
        if r.get("holder_state") is not None:
            rows.append({"lane": "another silent session", "start": t, "end": t + step,
                         "what": f"other session: {r['holder_state']}"})
    for e in events:
        if e["event"] in EVENT_WORDS and e["worker"] in ("A", "B"):
            rows.append({"lane": f"worker {e['worker']}", "start": e["t"], "end": e["t"],
                         "what": EVENT_WORDS[e["event"]]})
    rows.append({"lane": "worker A", "start": 0.0, "end": 0.0, "what": "A vanishes"})
    if back_after is not None:
        rows.append({"lane": "worker A", "start": back_after, "end": back_after,
                     "what": "A is back"})
    return pd.DataFrame(rows, columns=["lane", "start", "end", "what"])
