"""Finding ``vanish``: a worker disappears mid-job without closing anything, and the server waits.

Beyond the article. A worker claims a job whose handler writes and, inside its work's
transaction, vanishes: its network goes silent (no FIN, no RST) or its process is frozen. (A
handler that has not written holds no xid: the corrected worker's start is a read.) Three runs:

- ``proxy`` (tenantlab/netproxy.py, on the lab's server): the backend stays *idle in
  transaction* holding its locks and its xid (the horizon, notebook 07); the lease lets worker
  B take the job over; when A's network comes back its finish is fenced, and the outside world
  saw two calls. Server-side keepalives set on A's connection notice nothing here: the proxy's
  kernel answers them. ``idle_in_transaction_session_timeout`` does end a second such session.
- ``sigstop``: the same with A's process frozen: it resumes and calls the outside world after
  B already completed the job.
- ``tcp`` (a network namespace whose link is cut, a throwaway cluster): how long until the
  server notices, per setting, with packets really dropped; needs root and iproute2, else
  those settings are reported as not measured (None). The kernel's defaults are computed from
  its settings, never waited for.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
from jobqueue import HeartbeatError

from .. import finding
from ..finding import Result, Verdict, check, knob, plain
from ..queue import check_heartbeat
from . import _cluster, _netns, _tcp
from ._vanish_run import vanish

CLAIM = ("A worker that vanishes mid-job (a network blackhole, a frozen process) after its "
         "handler wrote leaves its backend idle in transaction, holding its locks and the "
         "horizon, until a timer ends "
         "it: hours with the kernel's defaults, seconds after the cut with keepalives or "
         "tcp_user_timeout, and idle_in_transaction_session_timeout its setting after the "
         "session's last statement (2 s: 2.02 to 2.03 s, read on the server's clock); "
         "meanwhile the lease lets another worker take the job, the vanished worker's late "
         "finish is fenced, and the outside world sees two calls.")

ARTICLE: dict[str, Any] = {
    "note": "not in the article: beyond it (the first failure a production team meets)",
}

PARTS = ("proxy", "sigstop", "tcp")
#: The tcp part's settings, by name (the keys of ``server_noticed_s``), in _tcp.probes' order.
PROBES = tuple(p.setting for p in _tcp.probes(1, 1, 1, 1.0))
IDLE_TIMEOUT = "idle_in_transaction_session_timeout"
NOT_RUN = "the tcp part was not run"
#: Seconds a timer may act after its setting (sampling every 0.1-0.2 s, a busy machine).
SLACK = 2.0
#: The checks that compare a time with a setting (the tests assert behaviour, not these).
TIMED = ("server keepalives (packets dropped)", "tcp_user_timeout, a result in flight",
         IDLE_TIMEOUT)

#: The settings that bound a vanished worker: where each is set, what it bounds, what the kit
#: recommends (jobqueue: the worker's connection and the role's settings).
SETTINGS = [
    {"setting": "tcp_keepalives_idle / _interval / _count",
     "where": "server: postgresql.conf, per role (ALTER ROLE … SET), or the client's "
              "options='-c …'",
     "bounds": "how long the server keeps the backend of a vanished client that sends nothing "
               "(idle, or idle in transaction): idle + count × interval",
     "kit recommends": "30 / 10 / 3 on the worker role (about 60 s); 0 = the kernel's "
                       "7200 / 75 / 9 (2 h 11 min)"},
    {"setting": "tcp_user_timeout (server)",
     "where": "server: postgresql.conf, per role, or options='-c …'",
     "bounds": "how long data the server sent may stay unacknowledged (a result in flight to "
               "a vanished client); not an idle backend",
     "kit recommends": "30 s on the worker role; 0 = the kernel's retransmissions "
                       "(tcp_retries2 = 15: about 15 min)"},
    {"setting": "keepalives, keepalives_idle / _interval / _count",
     "where": "client: libpq conninfo",
     "bounds": "how long the worker waits, idle (LISTEN), for a server that vanished; the "
               "server learns nothing from them",
     "kit recommends": "1, 30 / 10 / 3 (the worker's connection sets them)"},
    {"setting": "tcp_user_timeout (client)",
     "where": "client: libpq conninfo",
     "bounds": "how long the worker's own statement may stay unacknowledged by a vanished "
               "server",
     "kit recommends": "30 s"},
    {"setting": IDLE_TIMEOUT,
     "where": "server: per role (ALTER ROLE tenantlab_worker SET …) or per session",
     "bounds": "how long any backend idle inside a transaction keeps its locks and xid, "
               "whatever the network or the process does (a frozen worker too)",
     "kit recommends": "5 min on the worker role: above the longest pause between two "
                       "statements of a job"},
    {"setting": "lease (+ heartbeat)",
     "where": "worker: --lease, --heartbeat",
     "bounds": "how long until another worker may take the job over; the late finish is "
               "fenced",
     "kit recommends": "lease 30 s, heartbeat 10 s, a maximum runtime"},
]


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """Seconds: the lease, heartbeat, work and how long A is gone; the timers under test."""

    ARTICLE_SETUP: ClassVar[bool] = False  # the article never ran this: judged on expectations

    lease: float = knob(2.0, lo=1.0, hi=6.0, step=0.5, label="lease (s)")
    heartbeat: float = knob(0.5, lo=0.1, hi=3.0, step=0.1, label="heartbeat every (s)")
    job: float = knob(2.5, lo=0.5, hi=8.0, step=0.5, label="job duration (s)")
    vanished_for: float = knob(5.0, lo=2.0, hi=20.0, step=1.0, label="A vanished for (s)")
    keepalive_idle: int = knob(1, lo=1, hi=10, label="tcp_keepalives_idle (s)")
    keepalive_interval: int = knob(1, lo=1, hi=5, label="tcp_keepalives_interval (s)")
    keepalive_count: int = knob(2, lo=1, hi=5, label="tcp_keepalives_count")
    user_timeout: float = knob(2.0, lo=0.5, hi=10.0, step=0.5, label="tcp_user_timeout (s)")
    idle_timeout: float = knob(2.0, lo=0.5, hi=10.0, step=0.5,
                               label="idle_in_transaction_session_timeout (s)")
    parts: tuple[str, ...] = knob(PARTS, one_of=PARTS)

    def __post_init__(self) -> None:
        super().__post_init__()  # types, bounds and parts, from the knobs' metadata
        try:
            check_heartbeat(self.lease, self.heartbeat, None)
        except HeartbeatError as e:
            raise finding.KnobError(str(e)) from None

    def keepalive_s(self) -> float:
        """Return when server keepalives end an idle backend: idle + count × interval."""
        return float(self.keepalive_idle + self.keepalive_count * self.keepalive_interval)

    def bound_s(self) -> float:
        """Return how long the tcp run waits at most for a setting to act."""
        return max(self.keepalive_s(), self.user_timeout + 1.0) + 3.0


def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Run the chosen parts; return what the server kept, who noticed when, what the world saw."""
    k = knobs or Knobs.sized()
    runs: dict[str, dict[str, Any]] = {}
    common: dict[str, Any] = {"lease": k.lease, "heartbeat": k.heartbeat, "job": k.job,
              "vanished_for": k.vanished_for, "idle_timeout": k.idle_timeout,
              "keepalive": (k.keepalive_idle, k.keepalive_interval, k.keepalive_count)}
    tcp, why_not, measuring = None, None, None
    # The tcp part runs on a cluster of its own, beside the other two: the notebook waits for
    # the slowest, not the sum. Leaving the pool waits for it (its namespace and cluster go).
    with ThreadPoolExecutor(1, thread_name_prefix="vanish-tcp") as pool:
        if "tcp" in k.parts:
            why_not = _netns.available() or _cluster.available()
            if why_not is None:
                measuring = pool.submit(_measure_tcp, k)
        for how in ("proxy", "sigstop"):
            if how in k.parts:
                runs[how] = vanish(how, live=live if how == "proxy" else None, **common)
                if live is not None and how == "proxy":
                    live.update(runs[how]["timeline"])  # with the events after A came back
                if progress:
                    progress(1)
        if measuring is not None:
            tcp, why_not = measuring.result()
        if progress and "tcp" in k.parts:
            progress(1)
    measured = _measured(k, runs, tcp, why_not)
    table = pd.DataFrame([{"run": how, **r["facts"]} for how, r in runs.items()])
    data: dict[str, Any] = {**runs, "tcp": tcp}
    return Result("vanish", k, measured, judge(measured, k),
                  table=table, data=data)


def _measure_tcp(k: Knobs) -> tuple[_tcp.Outcome | None, str | None]:
    """Return the tcp part's outcome, or why this machine could not drop packets after all."""
    try:
        return _tcp.measure(_tcp.probes(k.keepalive_idle, k.keepalive_interval,
                                        k.keepalive_count, k.user_timeout), k.bound_s()), None
    except (_netns.NetnsError, _cluster.ClusterError) as e:
        return None, str(e)


def _measured(k: Knobs, runs: dict[str, dict[str, Any]], tcp: _tcp.Outcome | None,
              why_not: str | None) -> dict[str, Any]:
    proxy = runs.get("proxy", {}).get("facts", {})
    frozen = runs.get("sigstop", {}).get("facts", {})
    main = proxy or frozen
    noticed: dict[str, float | None] = {p.setting: None for p in _tcp.probes(
        k.keepalive_idle, k.keepalive_interval, k.keepalive_count, k.user_timeout)}
    if tcp is not None:
        noticed.update(tcp.server_noticed_s)
    noticed[IDLE_TIMEOUT] = proxy.get("idle_timeout_noticed_s")  # from the cut, like the others
    noticed["kernel defaults"] = None  # never waited for: see default_extrapolated_s
    m: dict[str, Any] = {
        "server_noticed_s": noticed,
        # The idle timer starts at the session's last statement (state_change), not the cut.
        "idle_timeout_after_last_statement_s": proxy.get("idle_timeout_after_last_statement_s"),
        "idle_timeout_resolution_s": proxy.get("idle_timeout_resolution_s"),
        "held_locks_while_vanished": bool(main.get("held_locks")),
        "horizon_held": bool(main.get("horizon_held")),
        "taken_over_after_s": main.get("taken_over_after_s"),
        "late_finish_fenced": bool(main.get("late_finish_fenced")),
        "outside_executions": int(main.get("outside_executions", 0)),
        "worker_noticed_s": tcp.worker_noticed_s if tcp else {},
        "default_extrapolated_s": _tcp.kernel_defaults(),
        "packets_dropped": "measured: a network namespace's link cut" if tcp else
        f"not measured here: {why_not or NOT_RUN}",
        "tcp_waited_s": tcp.bound_s if tcp else None,
        "backend_state_while_vanished": main.get("backend_state"),
        "migration_blocked": main.get("migration_blocked"),
        "settings": {"lease": k.lease, "heartbeat": k.heartbeat, "job": k.job,
                     "vanished_for": k.vanished_for, "keepalive": k.keepalive_s(),
                     "user_timeout": k.user_timeout, "idle_timeout": k.idle_timeout},
    }
    if proxy:
        m["proxy"] = {"server_noticed_through_proxy": proxy["server_noticed"],
                      "backend_state": proxy["backend_state"]}
    if frozen:
        m["sigstop"] = {key: frozen[key] for key in (
            "backend_state", "server_noticed", "taken_over_after_s", "late_finish_fenced",
            "outside_executions", "late_call_after_owner_s")}
    return plain(m)


def expect_takeover(k: Knobs, margin: float = 1.0) -> bool | None:
    """Return whether B should take the job over before A is back (None: too close to call)."""
    if k.vanished_for > k.lease + k.heartbeat + margin:
        return True
    if k.vanished_for + 0.3 < k.lease - margin:
        return False
    return None


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Judge what the server kept, the takeover and fence, and each timer against its setting."""
    k = knobs or Knobs()
    s = measured.get("settings", {})
    lease, vanished_for = s.get("lease", k.lease), s.get("vanished_for", k.vanished_for)
    kk = Knobs.of(lease=lease, heartbeat=s.get("heartbeat", k.heartbeat),
                  vanished_for=vanished_for)
    takeover = expect_takeover(kk)
    checks = [] if not ("proxy" in measured or "sigstop" in measured) else [
        check("the vanished backend keeps its locks", measured["held_locks_while_vanished"],
              "yes: idle in transaction, a migration waits",
              f"{'yes' if measured['held_locks_while_vanished'] else 'no'}: "
              f"{measured.get('backend_state_while_vanished')}, migration "
              f"{'blocked' if measured.get('migration_blocked') else 'not blocked'}"),
        check("it holds the horizon", measured["horizon_held"], True, measured["horizon_held"]),
    ]
    after = measured["taken_over_after_s"]
    if takeover is not None and checks:
        ok = (after is not None) == takeover
        checks.append(check("another worker takes the job over", ok,
                            f"yes, after the lease ({lease:g} s)" if takeover else
                            f"no: A is back after {vanished_for:g} s, before its lease ends",
                            f"after {after:.1f} s" if after is not None else "no"))
        want = 2 if takeover else 1
        checks.append(check("the outside world saw", measured["outside_executions"] == want,
                            f"{want} call{'s' * (want > 1)}",
                            f"{measured['outside_executions']} call"
                            f"{'s' * (measured['outside_executions'] != 1)}"))
        if takeover:
            checks.append(check("the late finish is fenced", measured["late_finish_fenced"],
                                True, measured["late_finish_fenced"]))
    noticed = measured["server_noticed_s"]
    iit = s.get("idle_timeout", k.idle_timeout)
    if IDLE_TIMEOUT in noticed and "proxy" in measured:
        got, cut = measured.get("idle_timeout_after_last_statement_s"), noticed[IDLE_TIMEOUT]
        if got is not None or "idle_timeout_after_last_statement_s" in measured:
            step = measured.get("idle_timeout_resolution_s") or 0.0
            checks.append(check(
                IDLE_TIMEOUT, got is not None and iit - step <= got <= iit + SLACK,
                f"ends it {iit:g} s after its last statement",
                "not noticed" if got is None else
                f"{got:.2f} s after its last statement (to within {step:.2f} s; "
                f"{_secs(cut)} after the cut)", timing=True))
        else:  # a stored run from before the last statement was read: from the cut
            checks.append(check(IDLE_TIMEOUT, _within(cut, iit + SLACK),
                                f"ends it within {iit:g} s of the cut", _secs(cut),
                                timing=True))
        through = measured["proxy"]["server_noticed_through_proxy"]
        checks.append(check("keepalives through a silent proxy", not through,
                            "notice nothing (its kernel answers)",
                            "noticed" if through else "noticed nothing"))
    if "sigstop" in measured:
        f = measured["sigstop"]
        late = f["late_call_after_owner_s"]
        checks.append(check("frozen worker: taken over, fenced, calls late",
                            f["late_finish_fenced"] and f["outside_executions"] == 2
                            and not f["server_noticed"] if takeover else True,
                            "fenced, 2 calls, the server never notices",
                            f"{'fenced' if f['late_finish_fenced'] else 'not fenced'}, "
                            f"{f['outside_executions']} calls"
                            + (f", A's call {late:.1f} s after B completed" if late is not None
                               else "")))
    if str(measured.get("packets_dropped", "")).startswith("measured"):
        ka, ut = s.get("keepalive", k.keepalive_s()), s.get("user_timeout", k.user_timeout)
        server_ka, in_flight, idle_ut, client_ka, client_ut = (
            noticed.get(name) for name in PROBES)
        client = client_ka is None and client_ut is None
        checks += [
            check("server keepalives (packets dropped)", _within(server_ka, ka + SLACK),
                  f"within {ka:g} s of the cut", _secs(server_ka), timing=True),
            check("tcp_user_timeout, a result in flight", _within(in_flight, ut + SLACK),
                  f"within {ut:g} s of the cut", _secs(in_flight), timing=True),
            check("tcp_user_timeout alone, idle backend", idle_ut is None,
                  "not noticed (no data in flight)", _secs(idle_ut)),
            check("client-side settings tell the server", client,
                  "nothing (the worker notices)", "nothing" if client else "noticed"),
        ]
    elif NOT_RUN not in str(measured.get("packets_dropped")):
        checks.append(check("packets dropped for real", False, "a network namespace (root)",
                            measured.get("packets_dropped")))
    return Verdict.of(checks, article=False)


def _within(value: float | None, limit: float) -> bool:
    return value is not None and value <= limit


def _secs(value: float | None) -> str:
    return "not noticed" if value is None else f"{value:.1f} s"



def settings_table() -> pd.DataFrame:
    """Return the settings that bound a vanished worker: where set, what bounded, recommended."""
    return pd.DataFrame(SETTINGS)


def script(res: Result, how: str = "proxy") -> pd.DataFrame:
    """Return the interleaving of one run as the Hermitage-style script: who did what, seen."""
    r = res.data.get(how)
    if not r:
        return pd.DataFrame(columns=["t (s)", "who", "does", "seen"])
    words = {"claim": "claims the job", "execute": "starts its work's transaction",
             "outside": "calls the outside world", "finish": "finishes: its attempt still owns the job",
             "fenced": "tries to finish: fenced, rolls back", "lease-lost": "heartbeat: lease lost"}
    rows = [{"t (s)": round(e["t"], 2), "who": f"worker {e['worker']}", "does": words[e["event"]],
             "seen": f"attempt {e.get('attempt')}"} for e in r["events"]
            if e["event"] in words and e["worker"] in ("A", "B")]
    f = r["facts"]
    gone = ("its network goes silent (no FIN, no RST)" if how == "proxy"
            else "its process is frozen (SIGSTOP)")
    rows.append({"t (s)": 0.0, "who": "worker A", "does": gone,
                 "seen": f"server: {f['backend_state']}, locks and xid held"})
    rows.append({"t (s)": f["back_after_s"], "who": "worker A",
                 "does": "comes back" + (" (network)" if how == "proxy" else " (SIGCONT)"),
                 "seen": "its pending finish reaches the server"})
    if f.get("idle_timeout_noticed_s") is not None:
        rows.append({"t (s)": f["idle_timeout_noticed_s"], "who": "server",
                     "does": f"ends the other silent session ({IDLE_TIMEOUT})",
                     "seen": "its locks and xid released"})
    return pd.DataFrame(rows).sort_values("t (s)", kind="stable").reset_index(drop=True)
