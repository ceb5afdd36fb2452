"""`tenantlab bench --peers`: each peer drains real jobs; the README's table says what a run did.

Behaviour, not timing: every peer (installed with the dev extra) runs a handful of no-op jobs on
its own driver and reports a rate from its first job to its last; the table tool renders a run's
keys (rows, WAL flushes, durability notes, doc links, targets) without inventing any. One awa
database serves both of awa's rows: its migrations are most of its time.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from tenantlab import bench, bench_peers, db

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import bench_table  # noqa: E402

JOBS = 5


def _check(rate: dict[str, float]) -> None:
    assert rate["jobs_per_s"] > 0 and rate["cpu_ms_per_job"] >= 0


@pytest.mark.parametrize("name", ["procrastinate", "pgqueuer"])
def test_a_peer_drains_its_jobs(admin_dsn: str, name: str) -> None:
    # The bench reads the server's counters once the peer's sessions ended, in its database.
    seen: list[int] = []

    def drained() -> None:
        with db.connect(admin_dsn, "test drained") as c:
            seen.append(c.execute("select count(*) from pg_stat_activity where datname like"
                                  " %s", (f"%bench_{name}%",)).fetchone()[0])

    _check(bench_peers.drain(name, JOBS, drained))
    assert seen == [0]


def test_awa_drains_its_jobs_with_its_default_permits_and_with_one(admin_dsn: str) -> None:
    with db.scratch("bench_awa", admin_dsn) as s:
        for name in ("awa", "awa_one"):
            _check(asyncio.run(bench_peers.PEERS[name][0](s.admin, JOBS)))


def test_every_peer_is_installed_with_the_dev_extra() -> None:
    said: list[str] = []
    assert bench_peers.installed(lambda name, text: said.append(name)) == list(bench_peers.PEERS)
    assert not said
    # The results keys of `tenantlab bench --peers --json` (a contract: add, never rename).
    assert {"procrastinate", "pgqueuer", "awa", "awa_one"} <= bench_peers.PEERS.keys()
    assert bench_peers.PEERS.keys() == bench_peers.DURABILITY.keys() == bench_peers.DOCS.keys()


def test_a_peer_rate_needs_two_jobs() -> None:
    with pytest.raises(ValueError, match="at least 2 jobs"):
        bench_peers.drain("pgqueuer", 1)


def _run() -> dict:
    """A run's JSON as `tenantlab bench --peers --json` writes it (synthetic numbers)."""
    names = ["select1", "commit1", "single", "leased", "leased_batch_commit", "procrastinate",
             "pgqueuer", "awa", "awa_one", "workers_1"]
    rates = dict(zip(names, [9000, 2000, 800, 800, 2000, 300, 3000, 1500, 500, 800],
                     strict=True))
    jps = {k: float(v) for k, v in rates.items()}
    flushes = {k: 1.0 for k in names} | {"select1": 0.0, "leased_batch_commit": 0.1}
    return {
        "server_version": "17.11", "jobs": 2000, "rounds": 3,
        "settings": {"fsync": "on", "synchronous_commit": "on"},
        "results": {k: {"jobs_per_s": v} for k, v in jps.items()},
        "history": {"0": {"claim_ms": 0.5, "claim_ms_empty_queue": 0.1}},
        "scaling": {"1": jps["workers_1"]},
        "wal_flushes_per_job": flushes,
        "client_cpu_ms_per_job": {k: 0.5 for k in names},
        "durability": {k: v for k, v in (bench.DURABILITY | bench_peers.DURABILITY).items()
                       if k in jps} | {"workers_1": bench.DURABILITY["workers"]},
        "docs": {k: v for k, v in bench_peers.DOCS.items() if k in jps},
        "ratios": {"leased_vs_procrastinate": jps["leased"] / jps["procrastinate"],
                   "leased_vs_awa_one": jps["leased"] / jps["awa_one"],
                   "leased_batch_commit_vs_pgqueuer": 2000 / 3000,
                   "leased_batch_commit_vs_awa": 2000 / 1500},
    }


def test_the_table_shows_each_peer_with_its_durability_and_its_page() -> None:
    text = bench_table.table(_run())
    row = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    awa = next(line for key, line in row.items() if key.startswith("| [awa]"))
    assert bench_peers.DOCS["awa"] in awa and "| 1,500 | 1.00 | 0.500 | flush per batch" in awa
    assert any(bench_peers.DOCS["pgqueuer"] in key and "asyncpg" in key for key in row)
    assert "| 0.10 | 0.500 | flush per batch: 10 finishes" in text
    assert "| `leased` at least 2x procrastinate | 2.67x | ✓ |" in text
    assert "| `leased_batch_commit` at least PgQueuer (asyncpg) | 0.67x | ✗ |" in text
    assert "| `leased` at least awa one job at a time | 1.60x | ✓ |" in text
    # A row the run did not measure is not in the table.
    assert "pgqueuer_psycopg" not in text and "PgQueuer, its defaults on psycopg" not in text


def test_an_older_run_without_the_new_keys_still_renders() -> None:
    r = _run()
    for key in ("wal_flushes_per_job", "client_cpu_ms_per_job", "durability", "docs"):
        del r[key]
    text = bench_table.table(r)
    assert "| procrastinate, its defaults (psycopg, one job at a time) | 300 |  |  |  |" in text


def test_commit1_waits_for_one_wal_flush_per_commit_and_the_bench_counts_them(
        scratch: db.Scratch) -> None:
    before = bench.wal_flushes(scratch)
    assert before is not None, "the server does not count its WAL flushes"
    assert bench.commit1(scratch, 50) > 0
    time.sleep(bench.STATS_SETTLE)  # the session's counts reach the shared ones when it ends
    after = bench.wal_flushes(scratch)
    assert after is not None and after - before >= 50  # other sessions may flush too
