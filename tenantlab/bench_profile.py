"""Where a job's time goes, per bench row, and why a target was missed: measured, in the same run.

``tenantlab bench`` reads the server's counters before and after each row (each round): the
statements it ran and their execution time (``pg_stat_statements``, when the server loads it:
the embedded one does), its transactions and the time its sessions spent active
(``pg_stat_database``: every statement's parse, plan, execution and commit, the commit's WAL
flush included), its WAL flushes (``pg_stat_wal``), and the machine's CPU (``/proc/stat``, every
process of the machine: the server, the client, anything else running). Divided by the row's
jobs, with the client's CPU and the wall time per job, that is the row's profile; the wall time
splits into client CPU, server active time and the rest (round trips, waiting to be scheduled,
sleeping). The counters cover every database but the profiler's own, so the profiler does not
count itself.

Every number is a median over the rounds with its range (min-max); a target's ratio is
computed in each round (the rows of one round ran minutes apart at most) and judged on the
median. A missed target gets a ``why`` line from the two rows' profiles.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from . import db
from .queries import q

#: A session's statistics reach the shared counters when it ends (or goes idle, once a second):
#: time for the sessions of a row (its worker, heartbeat, peer pool) to end before reading.
SETTLE = 0.2

#: The profile's metrics, per job, each a median over the rounds (``profile`` in the JSON) and
#: their rounds (``profile_rounds``): what each says, for the table's header.
METRICS = {
    "wall_ms_per_job": "wall ms",
    "client_cpu_ms_per_job": "client CPU ms",
    "server_active_ms_per_job": "server active ms",
    "rest_ms_per_job": "rest ms",
    "statements_per_job": "statements",
    "server_exec_ms_per_job": "statements' execution ms",
    "transactions_per_job": "transactions",
    "wal_flushes_per_job": "WAL flushes",
    "machine_cpu_busy": "machine CPU busy",
}


def machine_cpu() -> tuple[float, float] | None:
    """Return the machine's (busy, total) CPU time so far in ticks, all cores; None: unknown."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "cpu":
        return None
    ticks = [float(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    total = sum(ticks)
    return total - ticks[3] - ticks[4], total


class Profiler:
    """Read the server's counters around each bench row, on one admin connection of its own.

    ``begin()`` before a row, ``mark()`` where the row's timed part starts (its set-up, such as
    queueing the jobs, left out), ``stop()`` where it ends, ``end(jobs)`` after: the row's
    counts per job. Without ``mark``/``stop`` the whole row is counted (a peer: its schema
    install and its enqueue too).
    """

    def __init__(self, dsn: str) -> None:
        self.conn = db.connect(dsn, "bench profile", autocommit=True)
        self.created = False
        self.statements = self._statements_available()
        self._begin: dict[str, Any] = {}
        self._stop: dict[str, Any] | None = None

    def _statements_available(self) -> bool:
        """Return whether pg_stat_statements can be read; create it where it is loaded only."""
        c = self.conn
        try:
            if db.scalar(c, q("bench_statements_installed")):
                c.execute(q("bench_statements_read")).fetchall()
                return True
            if "pg_stat_statements" not in str(db.scalar(c, q("bench_preloaded"))):
                return False
            c.execute(q("bench_statements_create"))
            self.created = True
            return True
        except psycopg.Error:
            return False

    def close(self) -> None:
        """Drop the extension if this profiler created it; close the connection."""
        try:
            if self.created:
                self.conn.execute(q("bench_statements_drop"))
        except psycopg.Error:
            pass
        self.conn.close()

    def snapshot(self) -> dict[str, Any]:
        """Return the counters now: server-wide but the profiler's own database."""
        out: dict[str, Any] = {"t": time.perf_counter(), "machine": machine_cpu()}
        c = self.conn
        for name in ("bench_wal_flushes", "bench_wal_flushes_io"):
            try:
                out["wal"] = float(db.scalar(c, q(name)))
                break
            except psycopg.Error:
                continue
        try:
            xacts, active = c.execute(q("bench_server_counts")).fetchone() or (None, None)
            out["xacts"] = None if xacts is None else float(xacts)
            out["active_ms"] = None if active is None else float(active)
        except psycopg.Error:  # before PostgreSQL 14: no active_time
            out["xacts"] = out["active_ms"] = None
        if self.statements:
            try:
                out["pgss"] = {tuple(r[:4]): (float(r[4]), float(r[5]))
                               for r in c.execute(q("bench_statements_read")).fetchall()}
            except psycopg.Error:
                self.statements = False
        return out

    def statements_of(self, dbname: str) -> dict[str, tuple[int, float]] | None:
        """Return one database's statements so far, by their first words: (calls, execution
        ms), summed; None without pg_stat_statements."""
        if not self.statements:
            return None
        out: dict[str, tuple[int, float]] = {}
        for text, calls, ms in self.conn.execute(q("bench_statements_of"), {"db": dbname}):
            c0, m0 = out.get(text, (0, 0.0))
            out[text] = (c0 + int(calls), m0 + float(ms))
        return out

    def begin(self) -> None:
        self._begin, self._stop = self.snapshot(), None

    def mark(self) -> None:
        """The row's timed part starts now: what came before (its set-up) is left out."""
        time.sleep(SETTLE)  # the set-up's sessions report their counts when they end
        self._begin = self.snapshot()

    def stop(self) -> None:
        """The row's timed part ended (its sessions closed): count up to here."""
        time.sleep(SETTLE)
        self._stop = self.snapshot()

    def end(self, jobs: int) -> dict[str, float | None]:
        """Return the row's counts per job since begin (or mark) up to stop (or now)."""
        if self._stop is None:
            time.sleep(SETTLE)
        after = self._stop or self.snapshot()
        return per_job(self._begin, after, jobs)


def _delta(before: dict[str, Any], after: dict[str, Any], key: str) -> float | None:
    if before.get(key) is None or after.get(key) is None:
        return None
    return float(after[key] - before[key])


def per_job(before: dict[str, Any], after: dict[str, Any], jobs: int) -> dict[str, float | None]:
    """Return the counters' differences per job (two snapshots of ``Profiler.snapshot``)."""
    n = max(jobs, 1)
    out: dict[str, float | None] = {}
    for key, name in (("wal", "wal_flushes_per_job"), ("xacts", "transactions_per_job"),
                      ("active_ms", "server_active_ms_per_job")):
        d = _delta(before, after, key)
        out[name] = None if d is None else d / n
    if "pgss" in before and "pgss" in after:
        # Per statement and database: an entry evicted in between is not counted negative.
        calls = exec_ms = 0.0
        for k, (c1, t1) in after["pgss"].items():
            c0, t0 = before["pgss"].get(k, (0.0, 0.0))
            if c1 >= c0:
                calls, exec_ms = calls + c1 - c0, exec_ms + t1 - t0
        out["statements_per_job"], out["server_exec_ms_per_job"] = calls / n, exec_ms / n
    else:
        out["statements_per_job"] = out["server_exec_ms_per_job"] = None
    m0, m1 = before.get("machine"), after.get("machine")
    out["machine_cpu_busy"] = (None if not m0 or not m1 or m1[1] <= m0[1]
                               else (m1[0] - m0[0]) / (m1[1] - m0[1]))
    return out


def complete(p: dict[str, float | None], jobs_per_s: float, cpu_ms_per_job: float | None,
             serial: bool = True) -> dict[str, float | None]:
    """Add the wall time per job and its rest: wall less client CPU less server active time.

    The rest is the round trips and the waiting (to be scheduled on a core, for a lock); it is
    negative where client and server overlap (a peer's concurrent jobs, a pipeline), and left
    out (`serial` false) where the client's CPU is not the timed part's (worker processes).
    """
    wall = 1000 / jobs_per_s if jobs_per_s > 0 else None
    out = dict(p, wall_ms_per_job=wall, client_cpu_ms_per_job=cpu_ms_per_job)
    server = p.get("server_active_ms_per_job")
    out["rest_ms_per_job"] = (None if not serial or wall is None or cpu_ms_per_job is None
                              or server is None else wall - cpu_ms_per_job - server)
    return out


def median_range(values: Sequence[float | None]) -> dict[str, Any] | None:
    """Return {"median", "min", "max", "rounds"} of the known values; None: none known."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return None
    return {"median": statistics.median(known), "min": min(known), "max": max(known),
            "rounds": known}


def fmt_range(values: Sequence[float] | dict[str, Any] | None, spec: str = ",.0f",
              suffix: str = "") -> str:
    """Format a median and its range over the rounds: ``1,305 (1,250-1,410)``; one round: alone."""
    r = values if isinstance(values, dict) or values is None else median_range(values)
    if r is None:
        return ""
    med = f"{r['median']:{spec}}{suffix}"
    lo, hi = f"{r['min']:{spec}}", f"{r['max']:{spec}}{suffix}"
    if len(r["rounds"]) < 2:
        return med
    return f"{med} ({lo}-{hi})"


def claim_values(r: dict[str, Any], *path: str) -> list[float]:
    """Return one claim measurement of each round of run `r` (``claim_rounds``), by its path."""
    return round_values(r.get("claim_rounds") or [], *path)


def round_values(rounds: Sequence[dict[str, Any]], *path: str) -> list[float]:
    """Return one measurement of each round, by its path (a round without it: left out)."""
    values = []
    for c in rounds:
        v: Any = c
        for key in path:
            v = v.get(key, {}) if isinstance(v, dict) else {}
        if isinstance(v, (int, float)):
            values.append(float(v))
    return values


# --- targets -------------------------------------------------------------------------------

#: (ratio key, target text, test, the rows it compares: (measured, control) or None).
Target = tuple[str, str, Callable[[float], bool], tuple[str, str] | None]
TARGETS: list[Target] = [
    ("leased_cost_vs_single", "`leased` costs at most 1.1x `single` per job", lambda v: v <= 1.1,
     ("leased", "single")),
    ("leased_vs_procrastinate", "`leased` at least 2x procrastinate", lambda v: v >= 2,
     ("leased", "procrastinate")),
    ("leased_heartbeat_vs_leased", "heartbeat on: at least 0.9x `leased`", lambda v: v >= 0.9,
     ("leased_heartbeat", "leased")),
    ("leased_vs_no_heartbeat", "the default heartbeat: `leased` at least 0.9x without it",
     lambda v: v >= 0.9, ("leased", "leased_no_heartbeat")),
    ("leased_batch_vs_pgqueuer", "`leased_batch` at least PgQueuer", lambda v: v >= 1,
     ("leased_batch", "pgqueuer")),
    ("leased_batch_commit_vs_pgqueuer", "`leased_batch_commit` at least PgQueuer (asyncpg)",
     lambda v: v >= 1, ("leased_batch_commit", "pgqueuer")),
    ("leased_vs_awa_one", "`leased` at least awa one job at a time", lambda v: v >= 1,
     ("leased", "awa_one")),
    ("leased_batch_commit_vs_awa", "`leased_batch_commit` at least awa with its default permits",
     lambda v: v >= 1, ("leased_batch_commit", "awa")),
    ("leased_priority_vs_plain", "priorities cost at most 10 % of `leased` (against "
     "`leased_plain`)", lambda v: v >= 0.9, ("leased_priority", "leased_plain")),
    ("leased_queues_vs_plain", "two queues cost at most 10 % of `leased` (against "
     "`leased_plain`)", lambda v: v >= 0.9, ("leased_queues", "leased_plain")),
    ("leased_unique_vs_plain", "unique keys cost at most 10 % of `leased` (against "
     "`leased_plain`)", lambda v: v >= 0.9, ("leased_unique", "leased_plain")),
    ("claim_at_history_vs_0", "claim with the history at most 1.5x without", lambda v: v <= 1.5,
     None),
    ("claim_empty_at_history_vs_0", "the same on an empty queue", lambda v: v <= 1.5, None),
    ("claim_not_due_vs_0", "claim behind jobs not yet due (scheduled, in backoff) at most 1.5x "
     "without", lambda v: v <= 1.5, None),
    ("claim_empty_not_due_vs_0", "the same on an empty queue", lambda v: v <= 1.5, None),
    ("claim_exhausted_vs_0", "claim behind exhausted unreaped jobs at most 1.5x without",
     lambda v: v <= 1.5, None),
    ("claim_empty_exhausted_vs_0", "the same on an empty queue", lambda v: v <= 1.5, None),
    ("claim_after_bulk_vs_claim", "first claims after `enqueue_many` of 100,000 at most 2x "
     "`claim_ms`", lambda v: v <= 2, None),
    ("claim_after_retry_dead_vs_claim", "first claims after `retry --dead` of 100,000 at most 2x "
     "`claim_ms`", lambda v: v <= 2, None),
    ("leased_round_robin_vs_leased", "`--fair round-robin` at least FIFO / 1.5 over the run's "
     "tenants", lambda v: v >= 1 / 1.5, ("leased_round_robin", "leased")),
    ("noisy_round_robin_vs_fifo", "noisy neighbour (workshop size, 4 worker processes): "
     "`--fair round-robin` costs at most 10 % of FIFO's jobs/s", lambda v: v >= 0.9,
     ("noisy_round_robin", "noisy_fifo")),
    ("noisy_round_robin_p95_cut", "the same: small tenants' p95 wait at least 10x lower than "
     "FIFO's", lambda v: v >= 10, None),
    ("noisy_limit_vs_fifo", "noisy neighbour: `--fair limit=1` costs at most 10 % of FIFO's "
     "jobs/s", lambda v: v >= 0.9, ("noisy_limit", "noisy_fifo")),
    ("noisy_limit_p95_cut", "the same: small tenants' p95 wait at least 10x lower than FIFO's",
     lambda v: v >= 10, None),
    ("workers_4_vs_1", "4 workers at least 2.5x one", lambda v: v >= 2.5,
     ("workers_4", "workers_1")),
    ("workers_8_vs_4", "8 workers no slower than 4", lambda v: v >= 1, ("workers_8", "workers_4")),
]

def _signed(v: float, spec: str) -> str:
    text = f"{v:+{spec}}"
    return "+" + text[1:] if float(text) == 0 else text  # no "-0.00"


def why(key: str, rounds: Sequence[float], ok: Callable[[float], bool],
        pair: tuple[str, str] | None, profile: dict[str, dict[str, Any]]) -> str:
    """Return one line that says, from the measured profiles, why target `key` reads missed.

    The rounds first: if some met the target and some did not, the miss is within the noise of
    the run. Then, for a target between two rows, what the measured row does per job beyond its
    control (statements, transactions, client CPU, server active time, the rest), and the
    machine's CPU while each ran (near 100 %: no core left to go faster on).
    """
    met = sum(1 for v in rounds if ok(v))
    r = median_range(rounds)
    assert r is not None
    parts = [f"{round(r['median'], 3):.2f}x"  # as judge stores it: the table's cell reads the same
             + (f" (rounds {r['min']:.2f}-{r['max']:.2f}x)" if len(rounds) > 1 else "")]
    if 0 < met < len(rounds):
        parts.append(f"{met} of {len(rounds)} rounds met it: within this run's noise")
    elif len(rounds) > 1:
        parts.append(f"missed in all {len(rounds)} rounds")
    if pair and pair[0] in profile and pair[1] in profile:
        a, b = profile[pair[0]], profile[pair[1]]
        diff = []
        for metric, unit, spec in (("statements_per_job", "statements", ".1f"),
                                   ("transactions_per_job", "transactions", ".2f"),
                                   ("wal_flushes_per_job", "WAL flushes", ".2f"),
                                   ("client_cpu_ms_per_job", "ms client CPU", ".3f"),
                                   ("server_active_ms_per_job", "ms server", ".3f"),
                                   ("rest_ms_per_job", "ms rest (round trips, waiting)", ".3f")):
            if a.get(metric) is not None and b.get(metric) is not None:
                diff.append(f"{_signed(a[metric] - b[metric], spec)} {unit}")
        if diff:
            parts.append(f"`{pair[0]}` against `{pair[1]}` per job: " + ", ".join(diff))
        busy = [x.get("machine_cpu_busy") for x in (a, b)]
        if all(v is not None for v in busy):
            parts.append(f"machine CPU busy {busy[0]:.0%} and {busy[1]:.0%}")
            if pair[0].startswith("workers_") and busy[0] is not None and busy[0] >= 0.9:
                # More workers go faster only on CPU left idle (other work on the machine
                # counts too: /proc/stat sees every process).
                parts.append(f"under `{pair[0]}` the machine's CPUs were {busy[0]:.0%} busy: "
                             "no core left to go faster on")
    return "; ".join(parts)


def judge(ratio_rounds: dict[str, list[float]], profile: dict[str, dict[str, Any]],
          details: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Return each measured target: its median ratio, range, rounds, met, and a why when missed
    (with `details[key]` added: what a target without two rows measured, e.g. a claim's ms)."""
    out: dict[str, dict[str, Any]] = {}
    for key, _text, ok, pair in TARGETS:
        if not ratio_rounds.get(key):
            continue
        rounds = [round(v, 3) for v in ratio_rounds[key]]  # one rounding for the table and the why
        r = median_range(rounds)
        assert r is not None
        met = ok(round(r["median"], 3))  # as `ratios` stores it and the table judges it
        out[key] = {"median": round(r["median"], 3), "min": round(r["min"], 3),
                    "max": round(r["max"], 3), "rounds": [round(v, 3) for v in rounds],
                    "met": met}
        if not met:
            out[key]["why"] = why(key, rounds, ok, pair, profile)
            if details and key in details:
                out[key]["why"] += "; " + details[key]
    return out
