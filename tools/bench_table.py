"""Write the README's benchmark table from a `tenantlab bench --json` file.

    tenantlab bench --peers --json bench.json
    python tools/bench_table.py bench.json          # rewrites README.md between the markers

Every number in the table is what that run measured; the targets of the corrected worker are
judged as ratios within the run (a busy machine slows every peer alike).
"""

from __future__ import annotations

import sys
from typing import Any

import readme_section

from tenantlab.bench_profile import METRICS, claim_values, fmt_range
from tenantlab.bench_profile import TARGETS as _TARGETS

ROWS = [
    ("select1", "round-trip floor: `select 1` on one connection"),
    ("commit1", "durable-commit floor: a one-row insert per commit, one round trip each"),
    ("ceiling_one", "ceiling, one job per transaction: the worker's own start, fenced finish and "
                    "next claim run by pgbench, no Python between them"),
    ("ceiling_batch", "ceiling, 10 jobs per transaction: savepoint, start and fenced finish each, "
                      "then the next claim, by pgbench"),
    ("single", "`single`: one transaction per job, error handler on"),
    ("leased", "`leased`: the worker loop and its defaults (durable claim, the next claim in "
               "the finish's commit, heartbeat on)"),
    ("leased_no_heartbeat", "`leased_no_heartbeat`: the same, `--heartbeat 0`"),
    ("leased_run_one", "`leased_run_one`: the claim committed on its own, then the work"),
    ("leased_heartbeat", "`leased_heartbeat`: one heartbeat thread per worker"),
    ("leased_batch", "`leased_batch`: `--batch 10`"),
    ("leased_batch_commit", "`leased_batch_commit`: `--batch 10 --batch-commit`"),
    ("leased_round_robin", "`leased_round_robin`: `leased` with `--fair round-robin`"),
    ("leased_limit", "`leased_limit`: `leased` with `--fair limit=1`"),
    ("procrastinate", "{procrastinate}, its defaults (psycopg, one job at a time)"),
    ("pgqueuer", "{PgQueuer}, its defaults on asyncpg, its documented driver (batches of 10)"),
    ("pgqueuer_psycopg", "PgQueuer, its defaults on psycopg"),
    ("awa", "{awa} (`awa-pg`), its defaults (10 permits)"),
    ("awa_one", "awa, one permit: one job at a time ({configuration})"),
    ("leased_plain", "`leased_plain`: `leased` on jobs queued by `enqueue_many` (the routing rows' "
                     "control)"),
    ("leased_priority", "`leased_priority`: `leased` on jobs of four priorities"),
    ("leased_queues", "`leased_queues`: `leased`, one worker serving two queues"),
    ("leased_unique", "`leased_unique`: `leased` on jobs that each have a unique key"),
    ("noisy_fifo", "noisy neighbour, FIFO: a burst of one tenant and 99 small tenants' jobs "
                   "arriving during the drain, 4 worker processes (`reproduce noisy-neighbour`)"),
    ("noisy_round_robin", "noisy neighbour, `--fair round-robin`"),
    ("noisy_limit", "noisy neighbour, `--fair limit=1`"),
    ("enqueue_one", "enqueue rate: one `enqueue` per job, in one transaction"),
    ("enqueue_many", "enqueue rate: `enqueue_many`, one statement"),
]
#: Where a label names a peer, the page its row links to: the run's ``docs`` key.
LINKS = {"procrastinate": "procrastinate", "PgQueuer": "pgqueuer", "awa": "awa",
         "configuration": "awa_one"}

# (ratio key, target text, test): the bench's own (tenantlab.bench_profile.TARGETS), which
# also names the two rows each compares for its why line.
TARGETS = [(key, text, ok) for key, text, ok, _pair in _TARGETS]


def _label(text: str, docs: dict[str, str]) -> str:
    """Fill a row's {Name} with a link to the page the run names for it (or the bare name)."""
    return text.format(**{name: f"[{name}]({docs[key]})" if key in docs else name
                          for name, key in LINKS.items()})


def _rate(row: dict[str, Any]) -> str:
    """A row's jobs/s: the median, and its range over the rounds when there were several."""
    return fmt_range(row["rounds"]) if len(row.get("rounds") or []) > 1 else \
        f"{row['jobs_per_s']:,.0f}"


def _claim(r: dict[str, Any], median: float, *path: str) -> str:
    """A claim's ms: the median, and its range over the rounds (``claim_rounds``)."""
    values = claim_values(r, *path)
    return fmt_range(values, ".3f") if len(values) > 1 else f"{median:.3f}"


def _measured(r: dict[str, Any], key: str, value: float) -> str:
    """A target's ratio: the median over the rounds, and its range (``targets``)."""
    t = r.get("targets", {}).get(key)
    return fmt_range(t, ".2f", "x") if t and len(t.get("rounds", [])) > 1 else f"{value:.2f}x"


def profile_table(r: dict[str, Any]) -> list[str]:
    """The rows' profiles per job: wall = client CPU + server active + rest; statements and
    their execution, transactions, WAL flushes, the machine's CPU while the row ran."""
    prof = r.get("profile") or {}
    if not prof:
        return []
    cols = list(METRICS)
    lines = ["", "Where each row's time goes, per job (median over the rounds; wall = client CPU "
             "+ server active + rest; server active: its sessions' time in statements, commits "
             "and their WAL flushes included, `pg_stat_database`; statements and their execution "
             "ms: `pg_stat_statements`"
             + ("" if r.get("statements_available", True) else
                ", not available on this server (transactions instead)")
             + "; rest: round trips and waiting, negative where client and server overlap; "
             "machine CPU busy: all cores, every process, `/proc/stat`; a peer's counts include "
             "its schema install and enqueue, a worker process's CPU its start-up):", "",
             "| row | " + " | ".join(METRICS[c] for c in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for key, v in prof.items():
        cells = []
        for c in cols:
            x = v.get(c)
            if x is None:
                cells.append("")
            elif c == "machine_cpu_busy":
                cells.append(f"{x:.0%}")
            elif c in ("statements_per_job",):
                cells.append(f"{x:.1f}")
            elif c in ("transactions_per_job", "wal_flushes_per_job"):
                cells.append(f"{x:.2f}")
            else:
                cells.append(f"{x:.3f}")
        lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
    return lines


def table(r: dict[str, Any]) -> str:
    res = r["results"]
    s = r.get("settings", {})
    flushes, cpu = r.get("wal_flushes_per_job", {}), r.get("client_cpu_ms_per_job", {})
    notes, docs = r.get("durability", {}), r.get("docs", {})
    lines = [f"Measured by `tenantlab bench` on PostgreSQL {r['server_version']} (fsync "
             f"{s.get('fsync', '?')}, synchronous_commit {s.get('synchronous_commit', '?')}), "
             f"{r['jobs']:,} no-op jobs, one worker, median of {r['rounds']} rounds (min-max: "
             "the rounds alternate the rows); jobs/s from each worker's first job's execution "
             "to its last (start-up and shut-down left out, ours as the peers'; "
             "`jobs_per_s_whole` in the JSON: from the worker's start to its end), WAL flushes "
             "per job counted by the server (`pg_stat_wal`) during each row, the client's CPU "
             "per job by the process that ran it over the same span (worker processes: their "
             "whole lives):", "",
             "| what | jobs/s | WAL flushes per job | client CPU ms per job | durability | "
             "of the ceiling (one / batch) |",
             "|---|---|---|---|---|---|"]
    ceiling = r.get("ceiling") or {}

    def flushed(key: str) -> str:
        return f"{flushes[key]:.2f}" if key in flushes else ""

    def cpu_ms(key: str) -> str:
        return f"{cpu[key]:.3f}" if key in cpu else ""

    for key, label in ROWS:
        if key in res:
            share = (" / ".join(f"{res[key]['jobs_per_s'] / ceiling[k]:.2f}"
                                for k in ("one", "batch") if k in ceiling)
                     if ceiling and not key.startswith(("ceiling", "enqueue", "select", "commit"))
                     else "")
            lines.append(f"| {_label(label, docs)} | {_rate(res[key])} | "
                         f"{flushed(key)} | {cpu_ms(key)} | {notes.get(key, '')} | {share} |")
    if scaling := r.get("scaling"):
        counts = " / ".join(scaling)
        rates = " / ".join(_rate(res[f"workers_{w}"]) if f"workers_{w}" in res else f"{v:,.0f}"
                           for w, v in scaling.items())
        each = " / ".join(flushed(f"workers_{w}") for w in scaling) if flushes else ""
        cpus = " / ".join(cpu_ms(f"workers_{w}") for w in scaling) if cpu else ""
        lines.append(f"| worker processes {counts} | {rates} | {each} | {cpus} | "
                     f"{notes.get('workers_1', '')} |")
    lines += profile_table(r)
    lines += ["", "| claim | ms | on an empty queue, ms |", "|---|---|---|"]
    for h, v in sorted(r["history"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| with {int(h):,} finished jobs | "
                     f"{_claim(r, v['claim_ms'], 'history', h, 'claim_ms')} | "
                     f"{_claim(r, v['claim_ms_empty_queue'], 'history', h, 'claim_ms_empty_queue')} |")
    if nd := r.get("not_due"):
        lines.append(f"| behind {nd['scheduled']:,} scheduled and {nd['backoff']:,} in backoff | "
                     f"{_claim(r, nd['claim_ms'], 'not_due', 'claim_ms')} | "
                     f"{_claim(r, nd['claim_ms_empty_queue'], 'not_due', 'claim_ms_empty_queue')} |")
    if (ex := r.get("exhausted", {})) and "claim_ms" in ex:
        lines.append(f"| behind {ex['exhausted']:,} exhausted, not yet reaped | "
                     f"{_claim(r, ex['claim_ms'], 'exhausted', 'claim_ms')} | "
                     f"{_claim(r, ex['claim_ms_empty_queue'], 'exhausted', 'claim_ms_empty_queue')}"
                     " |")
    if b := r.get("claim_after_bulk"):
        lines.append(f"| first claims after `enqueue_many` of {b['jobs']:,} (statistics from "
                     f"before; buffers of the first) | "
                     f"{_claim(r, b['claim_after_bulk_ms'], 'bulk', 'claim_after_bulk_ms')} "
                     f"({b['claim_after_bulk_buffers']} buffers) | |")
        lines.append(f"| first claims after `retry --dead` of {b['jobs']:,} | "
                     f"{_claim(r, b['claim_after_retry_dead_ms'], 'bulk', 'claim_after_retry_dead_ms')} "
                     f"({b['claim_after_retry_dead_buffers']} buffers) | |")
    lat = r.get("idle_latency_ms", {})
    if lat:
        lines += ["", "| idle latency, enqueue to start (once, after the rounds) | median ms | p95 ms |",
                  "|---|---|---|"]
        for name, v in lat.items():
            how = "LISTEN/NOTIFY" if name == "leased" else "the poll alone"
            lines.append(f"| {how} | {v['median']:.1f} | {v['p95']:.1f} |")
    ratios = r.get("ratios", {})
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for key, text, ok in TARGETS:
        if key in ratios:
            lines.append(f"| {text} | {_measured(r, key, ratios[key])} | "
                         f"{'✓' if ok(ratios[key]) else '✗'} |")
        else:
            lines.append(f"| {text} | not measured in this run (`--peers`, `--workers 8`) | |")
    if "enqueue_many" in res:
        rate = res["enqueue_many"]["jobs_per_s"]
        lines.append(f"| `enqueue_many` at least 20,000 jobs/s on this machine | {rate:,.0f} jobs/s | "
                     f"{'✓' if rate >= 20_000 else '✗'} |")
    if w := r.get("wake"):
        per = w["transactions_per_job"]
        lines.append(f"| one wake-up per job: about 1 server transaction per job with "
                     f"{w['workers']} idle workers | {per:.1f} | {'✓' if per <= 1.5 else '✗'} |")
        if (claims := w.get("claims_per_job")) is not None:
            lines.append(f"| one wake-up per job: at most 1.5 claims of the workers' own per job "
                         f"with {w['workers']} idle workers | {claims:.1f} | "
                         f"{'✓' if claims <= 1.5 else '✗'} |")
    if "leased" in lat:
        median = lat["leased"]["median"]
        lines.append(f"| idle latency median at most 10 ms | {median:.1f} ms | "
                     f"{'✓' if median <= 10 else '✗'} |")
    whys = [(text, t["why"]) for key, text, _ok in TARGETS
            if "why" in (t := r.get("targets", {}).get(key, {}))]
    if (w := r.get("wake")) and w["transactions_per_job"] > 1.5 \
            and (claims := w.get("claims_per_job")) is not None:
        whys.append((f"one wake-up per job with {w['workers']} idle workers",
                     f"{w['transactions_per_job']:.1f} server transactions per job, of which "
                     f"the workers' own claims are {claims:.1f} per job (one worker wakes and "
                     f"claims); the rest come from the {w['workers']} listening sessions, each of "
                     "which reads every NOTIFY in a transaction of its own (PostgreSQL 17 signals "
                     "every listening session of the database), measured once, after the rounds"))
    if whys:
        lines += ["", "Why each missed target missed, from the profiles above (same run):", ""]
        lines += [f"- {text}: {why}." for text, why in whys]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return readme_section.from_json("bench", __doc__, table, argv)


if __name__ == "__main__":
    sys.exit(main())
