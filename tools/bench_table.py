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
    ("enqueue_one", "enqueue rate: one `enqueue` per job, in one transaction"),
    ("enqueue_many", "enqueue rate: `enqueue_many`, one statement"),
]
#: Where a label names a peer, the page its row links to: the run's ``docs`` key.
LINKS = {"procrastinate": "procrastinate", "PgQueuer": "pgqueuer", "awa": "awa",
         "configuration": "awa_one"}

# (ratio key, target text, test)
TARGETS = [
    ("leased_cost_vs_single", "`leased` costs at most 1.1x `single` per job", lambda v: v <= 1.1),
    ("leased_vs_procrastinate", "`leased` at least 2x procrastinate", lambda v: v >= 2),
    ("leased_heartbeat_vs_leased", "heartbeat on: at least 0.9x `leased`", lambda v: v >= 0.9),
    ("leased_vs_no_heartbeat", "the default heartbeat: `leased` at least 0.9x without it",
     lambda v: v >= 0.9),
    ("leased_batch_vs_pgqueuer", "`leased_batch` at least PgQueuer", lambda v: v >= 1),
    ("leased_batch_commit_vs_pgqueuer", "`leased_batch_commit` at least PgQueuer (asyncpg)",
     lambda v: v >= 1),
    ("leased_vs_awa_one", "`leased` at least awa one job at a time", lambda v: v >= 1),
    ("leased_batch_commit_vs_awa", "`leased_batch_commit` at least awa with its default permits",
     lambda v: v >= 1),
    ("leased_priority_vs_plain", "priorities cost at most 10 % of `leased` (against "
     "`leased_plain`)", lambda v: v >= 0.9),
    ("leased_queues_vs_plain", "two queues cost at most 10 % of `leased` (against "
     "`leased_plain`)", lambda v: v >= 0.9),
    ("leased_unique_vs_plain", "unique keys cost at most 10 % of `leased` (against "
     "`leased_plain`)", lambda v: v >= 0.9),
    ("claim_at_history_vs_0", "claim with the history at most 1.5x without", lambda v: v <= 1.5),
    ("claim_empty_at_history_vs_0", "the same on an empty queue", lambda v: v <= 1.5),
    ("claim_not_due_vs_0", "claim behind jobs not yet due (scheduled, in backoff) at most 1.5x "
     "without", lambda v: v <= 1.5),
    ("claim_empty_not_due_vs_0", "the same on an empty queue", lambda v: v <= 1.5),
    ("claim_exhausted_vs_0", "claim behind exhausted unreaped jobs at most 1.5x without",
     lambda v: v <= 1.5),
    ("claim_empty_exhausted_vs_0", "the same on an empty queue", lambda v: v <= 1.5),
    ("claim_after_bulk_vs_claim", "first claims after `enqueue_many` of 100,000 at most 2x "
     "`claim_ms`", lambda v: v <= 2),
    ("claim_after_retry_dead_vs_claim", "first claims after `retry --dead` of 100,000 at most 2x "
     "`claim_ms`", lambda v: v <= 2),
    ("leased_round_robin_vs_leased", "`--fair round-robin` at least FIFO / 1.5 over the run's "
     "tenants", lambda v: v >= 1 / 1.5),
    ("workers_4_vs_1", "4 workers at least 2.5x one", lambda v: v >= 2.5),
    ("workers_8_vs_4", "8 workers no slower than 4", lambda v: v >= 1),
]


def _label(text: str, docs: dict[str, str]) -> str:
    """Fill a row's {Name} with a link to the page the run names for it (or the bare name)."""
    return text.format(**{name: f"[{name}]({docs[key]})" if key in docs else name
                          for name, key in LINKS.items()})


def table(r: dict[str, Any]) -> str:
    res = r["results"]
    s = r.get("settings", {})
    flushes, cpu = r.get("wal_flushes_per_job", {}), r.get("client_cpu_ms_per_job", {})
    notes, docs = r.get("durability", {}), r.get("docs", {})
    lines = [f"Measured by `tenantlab bench` on PostgreSQL {r['server_version']} (fsync "
             f"{s.get('fsync', '?')}, synchronous_commit {s.get('synchronous_commit', '?')}), "
             f"{r['jobs']:,} no-op jobs, one worker, median of {r['rounds']} rounds; WAL flushes "
             "per job counted by the server (`pg_stat_wal`) during each row, the client's CPU "
             "per job by the process that ran it (worker processes: their whole lives):", "",
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
            lines.append(f"| {_label(label, docs)} | {res[key]['jobs_per_s']:,.0f} | "
                         f"{flushed(key)} | {cpu_ms(key)} | {notes.get(key, '')} | {share} |")
    if scaling := r.get("scaling"):
        counts = " / ".join(scaling)
        rates = " / ".join(f"{v:,.0f}" for v in scaling.values())
        each = " / ".join(flushed(f"workers_{w}") for w in scaling) if flushes else ""
        cpus = " / ".join(cpu_ms(f"workers_{w}") for w in scaling) if cpu else ""
        lines.append(f"| worker processes {counts} | {rates} | {each} | {cpus} | "
                     f"{notes.get('workers_1', '')} |")
    lines += ["", "| claim | ms |", "|---|---|"]
    for h, v in sorted(r["history"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| with {int(h):,} finished jobs (queue empty) | {v['claim_ms']:.3f} "
                     f"({v['claim_ms_empty_queue']:.3f}) |")
    if nd := r.get("not_due"):
        lines.append(f"| behind {nd['scheduled']:,} scheduled and {nd['backoff']:,} in backoff "
                     f"(queue empty) | {nd['claim_ms']:.3f} ({nd['claim_ms_empty_queue']:.3f}) |")
    if (ex := r.get("exhausted", {})) and "claim_ms" in ex:
        lines.append(f"| behind {ex['exhausted']:,} exhausted, not yet reaped (queue empty) | "
                     f"{ex['claim_ms']:.3f} ({ex['claim_ms_empty_queue']:.3f}) |")
    if b := r.get("claim_after_bulk"):
        lines.append(f"| first claims after `enqueue_many` of {b['jobs']:,} (statistics from "
                     f"before) | {b['claim_after_bulk_ms']:.3f} ({b['claim_after_bulk_buffers']} "
                     "buffers) |")
        lines.append(f"| first claims after `retry --dead` of {b['jobs']:,} | "
                     f"{b['claim_after_retry_dead_ms']:.3f} "
                     f"({b['claim_after_retry_dead_buffers']} buffers) |")
    lat = r.get("idle_latency_ms", {})
    if lat:
        lines += ["", "| idle latency, enqueue to start | median ms | p95 ms |", "|---|---|---|"]
        for name, v in lat.items():
            how = "LISTEN/NOTIFY" if name == "leased" else "the poll alone"
            lines.append(f"| {how} | {v['median']:.1f} | {v['p95']:.1f} |")
    ratios = r.get("ratios", {})
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for key, text, ok in TARGETS:
        if key in ratios:
            lines.append(f"| {text} | {ratios[key]:.2f}x | {'✓' if ok(ratios[key]) else '✗'} |")
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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return readme_section.from_json("bench", __doc__, table, argv)


if __name__ == "__main__":
    sys.exit(main())
