"""`tenantlab check`: the checkers on synthetic trials (pass, fail with a witness, indeterminate),
the JSON's shape and the matrix's texts, then ONE small live run: naive fails poison and crash,
jobqueue passes them, and nothing is left behind (sessions, databases, processes), also when a
run is interrupted."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from tenantlab import db
from tenantlab.check import adapter, checks, matrix, runner
from tenantlab.check.adapter import Options, Policy
from tenantlab.check.checks import Fault, Job, Trial
from tenantlab.check.history import Execution
from tenantlab.check.queues import jobqueue, naive
from tenantlab.check.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

T0 = 1000.0


def trial(scenario: str, jobs: list[tuple[str, str]], executions: list[Execution],
          states: dict[str, str], **kw: object) -> Trial:
    t = Trial(scenario, bound=10, t0=T0, end=T0 + 10,
              jobs=[Job(i, k, 1, {}, T0) for i, k in jobs], executions=executions, states=states)
    for k, v in kw.items():
        setattr(t, k, v)
    return t


def ex(job: str, kind: str, pid: int, start: float, end: float | None, outcome: str | None = "ok",
       **kw: object) -> Execution:
    return Execution(f"{pid}-{start}", job, kind, pid, T0 + start,
                     end=None if end is None else T0 + end, outcome=outcome, **kw)  # type: ignore[arg-type]


# --- checkers on synthetic trials --------------------------------------------------------------


def test_poison_passes_when_the_job_is_final_and_the_one_behind_runs() -> None:
    t = trial("poison", [("1", "poison"), ("2", "ok")],
              [ex("1", "poison", 7, 0, 0.1, "error"), ex("2", "ok", 7, 0.2, 0.3)],
              {"1": "dead", "2": "done"})
    assert checks.check_poison(t).result == "pass"


def test_a_poison_job_final_by_its_own_retry_schedule_is_a_pass_with_its_time() -> None:
    # procrastinate recommended: three attempts, the last one waits a 5 s poll: final at 11.5 s,
    # as its settings say (budget 3, final by 12 s): a policy, not a failure.
    runs = [ex("1", "poison", 7, t, t + 0.01, "error") for t in (0.0, 5.5, 11.4)]
    t = trial("poison", [("1", "poison"), ("2", "ok")], runs + [ex("2", "ok", 7, 0.1, 0.2)],
              {"1": "failed", "2": "done"}, end=T0 + 12,
              snapshots=[(T0 + 11.5, {"1": "failed", "2": "done"})],
              policy=Policy(budget=3, poison_final=12.0))
    r = checks.check_poison(t)
    assert r.result == "pass" and r.measured["poison_final_s"] == 11.5
    assert r.measured["poison_bounded"] is True and r.measured["poison_budget"] == 3
    assert matrix.mark({"result": "pass", "runs": 1, "failed_runs": 0, "witness": [],
                        "measured": r.measured}, "poison") == "✓ 11.5 s"


def test_final_only_past_the_cap_is_capped_with_the_time_its_settings_give() -> None:
    # awa ★: 25 attempts on a 2^n s schedule capped at a day: final after ~9.7 days.
    runs = [ex("1", "poison", 7, 0, 0.01, "error"), ex("1", "poison", 7, 2.3, 2.31, "error")]
    t = trial("poison", [("1", "poison"), ("2", "ok")], runs + [ex("2", "ok", 7, 0.1, 0.2)],
              {"1": "queued", "2": "done"}, end=T0 + 20,
              policy=Policy(budget=25, poison_final=9.7 * 86400))
    r = checks.check_poison(t)
    assert r.result == "capped", r
    assert "bounded so far (2 of 25 executions in the" in r.witness[0] and "9.7 d" in r.witness[0]
    cell = {"result": "capped", "runs": 1, "failed_runs": 0, "witness": r.witness,
            "measured": r.measured}
    assert matrix.mark(cell, "poison") == "◷ 9.7 d"


def test_poison_loop_fails_with_a_witness_naming_job_count_and_pid() -> None:
    # An unbounded loop is a failure however fast it runs.
    runs = [ex("1", "poison", 4411, i / 100, i / 100 + 0.005, "error") for i in range(900)]
    r = checks.check_poison(trial("poison", [("1", "poison"), ("2", "ok")], runs,
                                  {"1": "queued", "2": "queued"}))
    assert r.result == "fail"
    assert r.witness[0].startswith("unbounded: job 1 (poison) ran 900 times in 9.0 s, every "
                                   "~0.01 s (pid 4411; error), past its budget of 3")
    assert r.witness[1].startswith("job 2 (ok) never ran")


def test_never_final_by_its_settings_fails_and_describes_the_loop() -> None:
    # PgQueuer ★: a crashed job re-picked every ~31 s by an idle worker's dequeue, its attempt
    # never counted; no budget of retries decides anything: never final by its settings.
    runs = [ex("1", "crash", 100 + i, 31.0 * i, None, None, attempt=1) for i in range(2)]
    t = trial("crash", [("1", "crash"), ("2", "ok")], runs, {"1": "running", "2": "running"},
              end=T0 + 36, policy=Policy(budget=None, crash_final=None, basis="re-picks are not "
                                                                               "counted"))
    r = checks.check_crash(t)
    assert r.result == "fail"
    assert r.witness[0].startswith("never final by its settings (re-picks are not counted): "
                                   "job 1 (crash) ran twice in 31.0 s, every ~31.0 s")
    assert "attempt number stayed 1: the re-runs were never counted" in r.witness[0]
    assert "job 2 (ok) never ran" in r.witness[1] and "queued beside the crash job" in r.witness[1]


def test_crash_without_bound_fails_and_says_attempts_past_the_maximum() -> None:
    runs = [ex("1", "crash", 100 + i, 2.0 * i, None, None, attempt=i + 1) for i in range(5)]
    r = checks.check_crash(trial("crash", [("1", "crash")], runs, {"1": "running"}))
    assert r.result == "fail"
    assert "ran 5 times" in r.witness[0] and "attempt numbers 1 to 5" in r.witness[0]
    assert "past its budget of 3 executions" in r.witness[0]


def test_a_timeout_is_never_a_pass_and_a_suite_error_is_indeterminate() -> None:
    t = trial("overrun", [("1", "sleep")], [ex("1", "sleep", 7, 0, None, None)], {"1": "running"})
    t.jobs[0].payload["seconds"] = 5.0
    assert checks.check_overrun(t).result == "fail"
    t.error = "OperationalError: connection refused"
    r = checks.check_overrun(t)
    assert r.result == "indeterminate" and "connection refused" in r.witness[0]
    assert checks.check_crash(trial("crash", [("1", "crash")], [], {"1": "queued"})).result \
        == "indeterminate"


def test_overrun_overlap_is_a_witness_with_both_pids_and_the_table() -> None:
    t = trial("overrun", [("17", "block")],
              [ex("17", "block", 4411, 0, 5.0), ex("17", "block", 4420, 3.7, 8.7)], {"17": "done"})
    t.jobs[0].payload["seconds"] = 5.0
    r = checks.check_overrun(t)
    assert r.result == "fail"
    assert r.witness == ["job 17 (block) ran twice, pids 4411 and 4420 overlapping 1.30 s (from "
                         "3.7 s); 2 of its executions ended ok; the table says done"]
    t.executions[1] = ex("17", "block", 4420, 5.1, 10.0)
    assert checks.check_overrun(t).result == "pass"


def test_a_second_execution_after_the_table_said_done_is_double_whatever_the_overlap() -> None:
    # The first run ends 30 ms after the second starts (under the old 50 ms noise), and the
    # table had already said done: a double execution.
    t = trial("overrun", [("5", "block")],
              [ex("5", "block", 1, 0, 5.03), ex("5", "block", 2, 5.0, 10.0)], {"5": "done"},
              snapshots=[(T0 + 4.99, {"5": "done"})])
    t.jobs[0].payload["seconds"] = 5.0
    r = checks.check_overrun(t)
    assert r.result == "fail" and "ran again at 5.0 s (pid 2) after the table had said done at " \
        "5.0 s" in r.witness[0]
    t.snapshots = []
    r = checks.check_overrun(t)
    assert r.result == "fail" and "overlapping 0.03 s" in r.witness[0]


def test_overrun_with_a_job_shorter_than_the_rows_timeout_is_na() -> None:
    t = trial("overrun", [("1", "block")], [ex("1", "block", 7, 0, 5.0)], {"1": "done"},
              policy=Policy(budget=3, timeout=30.0))
    t.jobs[0].payload["seconds"] = 5.0
    r = checks.check_overrun(t)
    assert r.result == "na" and "nothing to overrun" in r.witness[0]
    assert matrix.mark({"result": "na", "runs": 1, "failed_runs": 0, "witness": r.witness,
                        "measured": {}}, "overrun") == "n/a (nothing to overrun)"


def test_a_killed_workers_execution_ends_when_its_process_died() -> None:
    t = trial("crash", [("1", "sleep")],
              [ex("1", "sleep", 1, 0, None, None), ex("1", "sleep", 2, 3, 4)], {"1": "done"},
              faults=[Fault(T0 + 2, "kill", 1)])
    assert checks.overlaps(t) == []


def test_late_finish_overwrite_fails_and_a_fenced_one_passes() -> None:
    runs = [ex("3", "sleep", 51, 0, 5.0), ex("3", "sleep", 52, 2.6, 7.6)]
    fenced = [(T0 + 5.5, {"3": "running"}), (T0 + 7.8, {"3": "done"})]
    t = trial("late-finish", [("3", "sleep")], runs, {"3": "done"}, snapshots=fenced)
    assert checks.check_late_finish(t).result == "pass"
    t.snapshots = [(T0 + 5.5, {"3": "done"})]
    r = checks.check_late_finish(t)
    assert r.result == "fail"
    assert "worker pid 51" in r.witness[0] and "while pid 52" in r.witness[0]


def test_late_finish_without_a_takeover_is_na_not_a_pass() -> None:
    t = trial("late-finish", [("3", "sleep")], [ex("3", "sleep", 51, 0, 12.0)], {"3": "done"},
              notes={"frozen_s": 10.0}, policy=Policy(budget=3, timeout=30.0))
    r = checks.check_late_finish(t)
    assert r.result == "na" and r.witness[0].startswith("no takeover")
    assert matrix.mark({"result": "na", "runs": 1, "failed_runs": 0, "witness": r.witness,
                        "measured": r.measured}, "late-finish") == "n/a (no takeover)"


def test_a_job_cut_off_by_a_fault_that_its_timeout_reruns_past_the_cap_is_capped() -> None:
    # jobqueue ★: the finish was lost with the terminated session; its 30 s lease reruns it.
    t = trial("terminate", [("1", "sleep")], [ex("1", "sleep", 9, 0.8, 1.4)], {"1": "running"},
              end=T0 + 15, faults=[Fault(T0 + 1, "terminate", 555)],
              policy=Policy(budget=3, timeout=30.0))
    r = checks.check_terminate(t)
    assert r.result == "capped" and "its timeout (30.0 s)" in r.witness[0]
    t.policy = Policy(budget=1, timeout=None)  # nothing ever reruns it: lost
    assert checks.check_terminate(t).result == "fail"
    # PgQueuer ★ behind PgBouncer: its LISTEN is lost, its docs' fallback is a poll every 30 s.
    t = trial("pgbouncer", [("12", "sleep")], [], {"12": "queued"}, end=T0 + 15,
              policy=Policy(budget=1, timeout=30.0, poll=30.0))
    assert checks.check_pgbouncer(t).result == "capped"
    t.policy = Policy(budget=1, timeout=2.0, poll=2.0)  # it polls every 2 s: lost
    assert checks.check_pgbouncer(t).result == "fail"


def test_restart_and_terminate_state_two_facts() -> None:
    # The worker exited (a fact), the suite restarted it, no job was lost (the verdict).
    t = trial("terminate", [("1", "ok")], [ex("1", "ok", 9, 0, 0.1)], {"1": "done"},
              faults=[Fault(T0 + 1, "terminate", 555)], exits={9: (T0 + 1.2, 1, "Database error.")})
    r = checks.check_terminate(t)
    assert r.result == "pass" and r.measured["worker_survives"] is False
    assert r.measured["no_job_lost"] is True and r.measured["workers_exited"] == 1
    assert r.witness == ["(supervised) worker pid 9 exited at 1.2 s with status 1 "
                         "(Database error.)"]
    cell = {"result": "pass", "runs": 1, "failed_runs": 0, "witness": [], "measured": r.measured}
    assert matrix.mark(cell, "terminate") == "✓ (1 exits)"


def test_tenant_leak_and_worker_exits() -> None:
    t = trial("tenant-leak", [("1", "tenant"), ("2", "tenant")],
              [ex("1", "tenant", 9, 0, 0.1, seen_tenant="1"),
               ex("2", "tenant", 9, 0.2, 0.3, seen_tenant="7")], {"1": "done", "2": "done"})
    t.jobs[1].tenant = 8
    r = checks.check_tenant_leak(t)
    assert r.result == "fail" and "job 2 for tenant 8" in r.witness[0] and "tenant 7" in r.witness[0]


def test_wake_and_throughput_are_measured() -> None:
    t = trial("wake", [], [ex("1", "ok", 9, 0.012, 0.02)], {"1": "done"})
    t.jobs = [Job("1", "ok", 1, {"probe": True}, T0)]
    t.policy = Policy(budget=3, poll=0.5)
    w = checks.check_wake(t)
    assert w.measured["median_ms"] == 12.0 and w.measured["poll_s"] == 0.5
    t.notes["created"] = {"1": T0 - 0.003}  # the insert, on the server's clock, came first
    assert checks.check_wake(t).measured["median_ms"] == 15.0
    assert checks.check_wake(t).measured["from"] == "the insert's server timestamp"
    t = trial("throughput", [("1", "ok"), ("2", "ok")],
              [ex("1", "ok", 9, 0, 0.5), ex("2", "ok", 9, 0.5, 1.0)], {"1": "done", "2": "done"})
    assert checks.check_throughput(t).measured["jobs_per_s"] == 2.0


# --- the matrix: JSON and texts -----------------------------------------------------------------


def _cell(result: str, witness: list[str] | None = None, **measured: object) -> dict:
    return {"result": result, "runs": 1, "failed_runs": int(result == "fail"),
            "witness": witness or [], "measured": measured}


RESULT = {"server_version": "17.11", "date": "2026-12-02 08:05 UTC", "runs": 1, "seconds": 1.0,
          "rows": [
              {"queue": "lib", "setting": "default", "version": "1.0", "settings": {},
               "promises": "p.", "scenarios": {"crash": _cell("fail", ["job 1 looped"]),
                                               "wake": _cell("pass", median_ms=7.5),
                                               "tenant-leak": _cell("na", ["no hook"])}},
              {"queue": "lib", "setting": "recommended", "version": "1.0", "settings": {},
               "promises": "p.", "scenarios": {"crash": _cell("pass"),
                                               "wake": _cell("indeterminate", ["?"]),
                                               "tenant-leak": _cell("na")}}]}


def test_cells_render_hermitage_style() -> None:
    text = matrix.table(RESULT)
    first, second = text.splitlines()[1:3]
    assert "✗ 1 of 1" in first and "7.5 ms" in first and "n/a" in first
    assert "~" in second and "?" in second  # holds only with the recommended setting
    assert "lib ★ crash: job 1 looped" in text
    md = matrix.markdown(RESULT)
    assert "| lib | ★ | 1.0 | ✗ 1 of 1 |" in md and "job 1 looped" in md
    assert "<td class=\"fail\"" in matrix.page(RESULT)


def test_a_library_not_installed_is_a_row_that_says_how(monkeypatch: pytest.MonkeyPatch,
                                                        admin_dsn: str) -> None:
    missing = dataclasses.replace(naive.Naive(), name="nolib", install_hint="pip install nolib")
    monkeypatch.setattr(type(missing), "version", lambda self: None)
    monkeypatch.setattr(matrix, "rows", lambda names: iter([missing]))
    out = matrix.run(["nolib"], ["poison", "crash"])
    row = out["rows"][0]
    assert row["version"] is None and row["install_hint"] == "pip install nolib"
    assert {c["result"] for c in row["scenarios"].values()} == {"na"}
    assert "not installed: pip install nolib" in row["scenarios"]["poison"]["witness"][0]


def _shape(result: dict) -> None:
    assert set(result) >= {"server_version", "rows"}
    for row in result["rows"]:
        assert set(row) >= {"queue", "setting", "version", "settings", "scenarios"}
        assert row["setting"] in ("default", "scaled", "recommended")
        assert row["queue"] in ("naive", "jobqueue", "procrastinate", "pgqueuer", "awa")
        for s, c in row["scenarios"].items():
            assert s in SCENARIOS
            assert set(c) == {"result", "runs", "failed_runs", "witness", "measured"}
            assert c["result"] in ("pass", "fail", "na", "indeterminate", "capped")
            assert isinstance(c["witness"], list) and isinstance(c["measured"], dict)
            if c["result"] == "fail":
                assert c["witness"] and c["failed_runs"] >= 1


def test_the_stored_matrix_has_the_contract_shape_and_the_readme_shows_it() -> None:
    import check_matrix
    import readme_section

    stored = json.loads((ROOT / "docs" / "check.json").read_text())
    _shape(stored)
    readme = readme_section.README.read_text()
    section = readme.split("<!-- check-matrix:start -->\n", 1)[1].split("\n<!-- check-matrix:end -->")[0]
    assert section == check_matrix.matrix(stored), "run: python tools/check_matrix.py docs/check.json"


# --- live, small ---------------------------------------------------------------------------------

FAST = Options(lease=1.0)


def _leftovers(admin: str) -> tuple[list, list, list[int]]:
    with db.connect(admin, "suite", autocommit=True) as conn:
        sessions = conn.execute("select datname, application_name from pg_stat_activity "
                                "where datname like 'tenantlab_check_%'").fetchall()
        dbs = conn.execute("select datname from pg_database "
                           "where datname like 'tenantlab_check_%'").fetchall()
    return sessions, dbs, runner.children()


@pytest.mark.parametrize("name", ["poison", "crash"])
def test_live_naive_fails_and_jobqueue_passes(name: str, admin_dsn: str) -> None:
    scenario = dataclasses.replace(SCENARIOS[name], bound=6 if name == "poison" else 9)
    bad = scenario.checker(runner.run(naive.Naive(), scenario, options=FAST, dsn=admin_dsn))
    assert bad.result == "fail", bad
    assert any("never final by its settings" in w for w in bad.witness), bad.witness
    scaled = jobqueue.JobQueue(setting="scaled")
    good = scenario.checker(runner.run(scaled, scenario, options=FAST, dsn=admin_dsn))
    assert good.result == "pass", good
    assert _leftovers(admin_dsn) == ([], [], [])


@pytest.mark.parametrize("peer", ["procrastinate", "pgqueuer", "awa"])
def test_live_a_peer_with_its_defaults_and_a_crashed_job(peer: str, admin_dsn: str) -> None:
    """Issue 20's headline at true defaults, judged by each row's own settings: procrastinate
    leaves the job 'doing' and nothing will retry it, PgQueuer will re-pick it uncounted for
    ever (never final by its settings: ✗); awa will rescue it after 90 s, within its 25
    attempts (◷, not ✗: bounded so far). Each stops as soon as its settings say nothing more
    happens before the cap."""
    pytest.importorskip({"awa": "awa"}.get(peer, peer))
    row = next(r for r in adapter.rows([peer]) if r.setting == "default")
    scenario = dataclasses.replace(SCENARIOS["crash"], bound=9)
    verdict = scenario.checker(runner.run(row, scenario, options=FAST, dsn=admin_dsn))
    assert verdict.result == ("capped" if peer == "awa" else "fail"), verdict
    assert any("job 1" in w for w in verdict.witness), verdict.witness
    assert _leftovers(admin_dsn) == ([], [], [])


def test_an_interrupted_run_leaves_nothing(admin_dsn: str) -> None:
    def interrupted(ctx: runner.Context) -> None:
        ctx.enqueue("sleep", seconds=30)
        ctx.wait(5, until=lambda: bool(ctx.executions()))
        raise KeyboardInterrupt

    scenario = dataclasses.replace(SCENARIOS["overrun"], script=interrupted, workers=2)
    with pytest.raises(KeyboardInterrupt):
        runner.run(jobqueue.JobQueue(), scenario, options=FAST, dsn=admin_dsn)
    assert _leftovers(admin_dsn) == ([], [], [])


def test_the_command_line_refuses_an_unknown_queue_or_scenario(capsys: pytest.CaptureFixture) -> None:
    from tenantlab.cli import main

    assert main(["check", "--queue", "nope"]) == 2
    assert "unknown queue nope; valid: " in capsys.readouterr().err
    assert main(["check", "--repro", "pgqueuer", "crash"]) == 0
    script = capsys.readouterr().out
    assert "from pgqueuer import" in script and "tenantlab" not in script
    assert main(["check", "--repro", "pgqueuer", "nope"]) == 2
    assert "no script for pgqueuer nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["check", "--scenario", "nope"])
    assert e.value.code == 2 and "poison" in capsys.readouterr().err


def test_notebook_13_runs_top_to_bottom(admin_dsn: str) -> None:
    """The stored matrix, every row of it, and one live late-finish run with its verdict."""
    sys.path.insert(0, str(ROOT / "tests"))
    from notebooks import run_clean

    nb, _ = run_clean("13-any-queue.ipynb", admin_dsn)
    html = ["\n".join(o.get("data", {}).get("text/html", "") for o in c.get("outputs", []))
            for c in nb.cells if c.cell_type == "code"]
    stored = next(h for h in html if "poison" in h and "late-finish" in h and "pgqueuer" in h)
    assert all(q in stored for q in ("naive", "jobqueue", "procrastinate", "pgqueuer", "awa"))
    live = next(h for h in html if "late-finish" in h and "taken_over" in h)
    assert "✗" in live or "✓" in live
    assert _leftovers(admin_dsn) == ([], [], [])
