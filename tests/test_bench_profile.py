"""The bench's ranges, profiles and why lines (bench_profile), on synthetic numbers; one live row.

A number the kit states is a range over the rounds; a missed target says why from the two rows'
profiles, measured in the same run. Formatting and arithmetic are checked on made-up runs; the
profiler itself once, on the test server, around a loop of known commits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tenantlab import bench, bench_profile, db

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import bench_table  # noqa: E402


def test_a_number_is_its_median_and_its_range_over_the_rounds() -> None:
    assert bench_profile.fmt_range([1410.0, 1250.0, 1305.0]) == "1,305 (1,250-1,410)"
    assert bench_profile.fmt_range([1305.0]) == "1,305"  # one round: no range to show
    assert bench_profile.fmt_range([0.71, 0.5, None], ".2f", "x") == "0.60x (0.50-0.71x)"
    assert bench_profile.fmt_range([None]) == ""


def test_a_rows_counts_per_job_come_from_two_snapshots() -> None:
    before = {"wal": 10.0, "xacts": 100.0, "active_ms": 50.0, "machine": (100.0, 400.0),
              "pgss": {("u", "d", 1, True): (10.0, 1.0), ("u", "d", 2, True): (5.0, 2.0)}}
    after = {"wal": 110.0, "xacts": 300.0, "active_ms": 90.0, "machine": (250.0, 600.0),
             # statement 2 was evicted and came back with fewer calls: not counted negative
             "pgss": {("u", "d", 1, True): (210.0, 21.0), ("u", "d", 2, True): (1.0, 0.1),
                      ("u", "d", 3, True): (200.0, 4.0)}}
    p = bench_profile.per_job(before, after, 100)
    assert p["wal_flushes_per_job"] == 1.0 and p["transactions_per_job"] == 2.0
    assert p["server_active_ms_per_job"] == pytest.approx(0.4)
    assert p["statements_per_job"] == 4.0 and p["server_exec_ms_per_job"] == pytest.approx(0.24)
    assert p["machine_cpu_busy"] == 0.75
    # A server without pg_stat_statements (or before 14): those columns are not known.
    p = bench_profile.per_job({"wal": 1.0, "xacts": None}, {"wal": 2.0, "xacts": None}, 1)
    assert p["statements_per_job"] is None and p["transactions_per_job"] is None


def test_wall_time_splits_into_client_cpu_server_and_the_rest() -> None:
    p = bench_profile.complete({"server_active_ms_per_job": 0.5}, 1000.0, 0.3)
    assert p["wall_ms_per_job"] == 1.0 and p["rest_ms_per_job"] == pytest.approx(0.2)
    # Worker processes: their CPU is their whole lives over several cores, no rest to speak of.
    p = bench_profile.complete({"server_active_ms_per_job": 0.5}, 1000.0, 3.0, serial=False)
    assert p["rest_ms_per_job"] is None


PROFILE = {
    "single": {"wall_ms_per_job": 1.0, "statements_per_job": 5.0,
               "transactions_per_job": 1.0, "wal_flushes_per_job": 1.0,
               "client_cpu_ms_per_job": 0.29, "server_active_ms_per_job": 0.53,
               "rest_ms_per_job": 0.18, "machine_cpu_busy": 0.47},
    "leased": {"wall_ms_per_job": 1.3, "statements_per_job": 7.0,
               "transactions_per_job": 1.0, "wal_flushes_per_job": 1.0,
               "client_cpu_ms_per_job": 0.48, "server_active_ms_per_job": 0.58,
               "rest_ms_per_job": 0.32, "machine_cpu_busy": 0.52},
}


def test_a_missed_target_says_why_from_the_two_rows_profiles() -> None:
    t = bench_profile.judge({"leased_cost_vs_single": [1.32, 1.2, 1.4]}, PROFILE)
    got = t["leased_cost_vs_single"]
    assert got["met"] is False and got["median"] == 1.32 and (got["min"], got["max"]) == (1.2, 1.4)
    assert got["why"] == (
        "1.32x (rounds 1.20-1.40x); missed in all 3 rounds; `leased` against `single` per job: "
        "+2.0 statements, +0.00 transactions, +0.00 WAL flushes, +0.190 ms client CPU, "
        "+0.050 ms server, +0.140 ms rest (round trips, waiting); machine CPU busy 52% and 47%")


def test_a_target_missed_on_the_median_but_met_in_a_round_says_it_is_noise() -> None:
    t = bench_profile.judge({"leased_vs_no_heartbeat": [0.69, 0.95, 0.85]}, {})
    assert t["leased_vs_no_heartbeat"]["met"] is False
    assert "1 of 3 rounds met it: within this run's noise" in t["leased_vs_no_heartbeat"]["why"]
    met = bench_profile.judge({"leased_vs_no_heartbeat": [0.89, 0.95, 0.99]}, {})
    assert met["leased_vs_no_heartbeat"]["met"] is True and "why" not in met["leased_vs_no_heartbeat"]


def _run() -> dict:
    """A run's JSON as `tenantlab bench --rounds 3 --json` writes it (synthetic numbers)."""
    rounds = {"single": [1000.0, 950.0, 1090.0], "leased": [760.0, 700.0, 844.0]}
    ratio_rounds = {"leased_cost_vs_single": [a / b for a, b in zip(rounds["single"],
                                                                     rounds["leased"],
                                                                     strict=True)]}
    claim = [{"history": {"0": {"claim_ms": v, "claim_ms_empty_queue": 0.1}},
              "not_due": {}, "exhausted": {}, "bulk": {}} for v in (0.5, 0.45, 0.6)]
    return {
        "server_version": "17.11", "jobs": 2000, "rounds": 3, "seconds": 100.0,
        "settings": {"fsync": "on", "synchronous_commit": "on"},
        "results": {k: bench._rate(v) for k, v in rounds.items()},
        "history": {"0": {"claim_ms": 0.5, "claim_ms_empty_queue": 0.1}},
        "claim_rounds": claim,
        "ratios": {k: sorted(v)[1] for k, v in ratio_rounds.items()},
        "ratio_rounds": ratio_rounds,
        "targets": bench_profile.judge(ratio_rounds, PROFILE),
        "profile": PROFILE, "statements_available": True,
    }


def test_the_table_shows_ranges_profiles_and_the_why_of_each_miss() -> None:
    r = _run()
    assert r["results"]["single"]["jobs_per_s_range"] == [950.0, 1090.0]
    text = bench_table.table(r)
    assert "| `single`: one transaction per job, error handler on | 1,000 (950-1,090) |" in text
    assert "| with 0 finished jobs | 0.500 (0.450-0.600) | 0.100 (0.100-0.100) |" in text
    assert "| `leased` costs at most 1.1x `single` per job | 1.32x (1.29-1.36x) | ✗ |" in text
    assert "| `leased` | 1.300 | 0.480 | 0.580 | 0.320 | 7.0 |" in text
    why = next(line for line in text.splitlines() if line.startswith("- `leased` costs"))
    assert "+2.0 statements" in why and "+0.190 ms client CPU" in why


def test_without_pg_stat_statements_the_table_says_so() -> None:
    r = _run()
    r["statements_available"] = False
    r["profile"] = {k: dict(v, statements_per_job=None) for k, v in PROFILE.items()}
    text = bench_table.table(r)
    assert "not available on this server (transactions instead)" in text
    assert "| `single` | 1.000 | 0.290 | 0.530 | 0.180 |  |" in text


def test_the_text_report_shows_each_rows_range_and_profile() -> None:
    r = _run()
    lines = bench.report(r)
    assert any("single" in line and "1,000 (950-1,090) jobs/s" in line for line in lines)
    assert any("wall 1.300 ms = client CPU 0.480 + server 0.580 + rest 0.320" in line
               for line in lines)
    targets = bench.target_lines(r)
    assert targets[0].startswith("  ✗ `leased` costs at most 1.1x") and "why:" in targets[1]


def test_the_profiler_counts_a_rows_commits_and_leaves_nothing_behind(
        scratch: db.Scratch) -> None:
    profiler = bench_profile.Profiler(db.admin_dsn())
    try:
        before = profiler.statements_of(scratch.name)
        profiler.begin()
        bench.commit1(scratch, 50)
        p = profiler.end(50)
        after = profiler.statements_of(scratch.name)
    finally:
        profiler.close()
    if before is not None and after is not None:  # one database's statements, by first words
        insert = next(t for t in after if t.startswith("insert"))
        assert after[insert][0] - before.get(insert, (0, 0.0))[0] == 50
    # Other sessions of the server may add some; this row's own are all there.
    assert p["wal_flushes_per_job"] is not None and p["wal_flushes_per_job"] >= 1
    assert p["transactions_per_job"] is not None and p["transactions_per_job"] >= 1
    assert p["server_active_ms_per_job"] is not None and p["server_active_ms_per_job"] > 0
    if p["statements_per_job"] is not None:  # the embedded server loads pg_stat_statements
        assert p["statements_per_job"] >= 1
    with db.connect(db.admin_dsn(), "test profile") as c:
        left = c.execute("select count(*) from pg_stat_activity"
                         " where application_name = 'tenantlab bench profile'").fetchone()
    assert left == (0,)


def test_more_workers_missed_says_how_much_cpu_the_machine_had_left() -> None:
    profile = {"workers_1": {"machine_cpu_busy": 0.6}, "workers_4": {"machine_cpu_busy": 0.98}}
    t = bench_profile.judge({"workers_4_vs_1": [1.4, 1.5, 1.6]}, profile)["workers_4_vs_1"]
    assert "machine CPU busy 98% and 60%" in t["why"]
    assert "under `workers_4` the machine's CPUs were 98% busy: no core left" in t["why"]


def test_each_round_turns_the_order_so_a_row_and_its_control_take_every_place() -> None:
    rows = ["leased", "leased_heartbeat", "leased_no_heartbeat"]
    orders = [bench.turn(rows, i) for i in range(3)]
    assert orders[0] == rows and orders[1][0] == "leased_heartbeat"
    assert all(sorted(o) == sorted(rows) for o in orders)
    assert {o.index("leased") for o in orders} == {0, 1, 2}
    assert bench.turn([], 2) == []


def test_a_missed_claim_target_says_what_the_claims_measured() -> None:
    hist = {"0": {"claim_ms": 0.6, "claim_ms_empty_queue": 0.1},
            "100000": {"claim_ms": 1.2, "claim_ms_empty_queue": 0.1}}
    nd = {"claim_ms": 0.6, "claim_ms_empty_queue": 0.1}
    details = bench._claim_details(hist, 100_000, nd, {}, {})
    t = bench_profile.judge({"claim_at_history_vs_0": [2.0, 1.4, 2.1]}, {}, details)
    assert t["claim_at_history_vs_0"]["why"].endswith(
        "median claim 1.200 ms with 100,000 finished jobs against 0.600 ms without")
    assert "1 of 3 rounds met it" in t["claim_at_history_vs_0"]["why"]


def test_a_difference_that_rounds_to_nothing_is_not_negative() -> None:
    assert bench_profile._signed(-0.0004, ".2f") == "+0.00"
    assert bench_profile._signed(-0.25, ".2f") == "-0.25"


def test_the_wake_miss_says_how_many_of_its_transactions_are_claims() -> None:
    r = _run() | {"wake": {"workers": 10, "transactions_per_job": 19.7, "claims_per_job": 1.0}}
    text = bench_table.table(r)
    assert ("- one wake-up per job with 10 idle workers: 19.7 server transactions per job, of "
            "which the workers' own claims are 1.0 per job") in text


def _noisy_round(fifo: float, rr: float, limit: float) -> dict[str, object]:
    """One round of the noisy-neighbour rows, as bench.noisy keeps them (made-up numbers)."""
    def row(p95: float, claim_ms: float, several: float, alone: float) -> dict[str, object]:
        drain = {"small_tenants_wait_p95_s": p95, "several_tenants_jobs_per_s": several,
                 "several_tenants_jobs": 100, "burst_alone_jobs_per_s": alone,
                 "burst_alone_jobs": 999, "jobs_per_s": 0.0}
        return {"during_drain": drain, "queued_first": dict(drain),
                "claim": {"calls": 1100, "exec_ms_per_call": claim_ms}}

    return {"noisy_fifo": row(fifo, 0.09, 1500, 1500), "noisy_round_robin": row(rr, 0.24, 700, 1350),
            "noisy_limit": row(limit, 0.11, 850, 850)}


def test_the_noisy_rows_are_judged_against_fifo_in_the_same_round_with_their_wait_cut() -> None:
    r = _noisy_round(0.65, 0.05, 0.0004)
    ratios = bench._noisy_ratios({"noisy_fifo": 1500.0, "noisy_round_robin": 1200.0,
                                  "noisy_limit": 900.0}, r)
    assert ratios == {"noisy_round_robin_vs_fifo": 0.8, "noisy_round_robin_p95_cut": 13.0,
                      "noisy_limit_vs_fifo": 0.6, "noisy_limit_p95_cut": 650.0}  # 1 ms floor
    assert bench._noisy_ratios({"noisy_fifo": 1500.0}, r) == {}  # --noisy 0, or a row missing


def test_a_missed_noisy_target_says_what_its_claim_and_each_phase_measured() -> None:
    rounds = [_noisy_round(0.65, 0.05, 0.01)]
    rounds[0]["noisy_fifo"]["during_drain"]["jobs_per_s"] = 1500.0  # type: ignore[index]
    details = bench._noisy_details(rounds)
    t = bench_profile.judge({"noisy_round_robin_vs_fifo": [0.8], "noisy_limit_vs_fifo": [0.6]},
                            {}, details)
    why = t["noisy_round_robin_vs_fifo"]["why"]
    assert "its claim executes in 0.240 ms a call against FIFO's 0.090" in why
    assert ("while several tenants have work 700 jobs/s (100 jobs), the burst's tenant alone "
            "1,350 jobs/s (999 jobs), FIFO 1,500 jobs/s throughout") in why
    assert "one worker works, by design" in t["noisy_limit_vs_fifo"]["why"]
    assert "by design" not in why
    assert bench._noisy_details([]) == {}  # --noisy 0: nothing to say


def test_the_progress_shows_a_measurement_as_words_not_a_dict() -> None:
    assert bench.shown(1234.4) == "    1234 jobs/s"
    assert bench.shown({"workers": 10, "transactions_per_job": 18.65, "claims_per_job": 1.0}) == (
        "workers 10, transactions per job 18.65, claims per job 1")
    assert bench.shown({"jobs": 100000, "claim_ms": 0.679}) == "jobs 100,000, claim ms 0.679"
    assert bench.shown("1 of 3") == "1 of 3"
