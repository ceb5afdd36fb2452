"""Exercises: the kit's answer passes, typical wrong answers fail with their own nudge, cheats and
broken answers get one line, nothing is left behind, and the command line keeps its contract."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tenantlab import cli, db, exercises
from tenantlab.exercises import _core
from tenantlab.queries import q

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def progress_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "exercises.json"
    monkeypatch.setenv("TENANTLAB_EXERCISES", str(path))
    monkeypatch.delenv("TENANTLAB_SOLUTIONS", raising=False)
    return path


#: Answers participants typically write, and the words of the nudge each must get.
WRONG = [
    ("leak", "set app.tenant = %(tenant)s", "did the setting outlive its transaction?"),
    ("leak", "select set_config('app.tenant', '1', true)", "does your answer use the job's tenant"),
    ("poison", exercises.get("poison").starter, "attempts are still 0: the count rolled back"),
    ("poison", """update jobs set attempts = attempts + 1
                   where id = (select id from jobs where status = 'queued' order by id limit 1
                               for update skip locked)
                  returning id, tenant_id, attempts as attempt""",
     "Does your claim mark the job 'running'"),
    ("crash", exercises.get("crash").starter, "the count was in the dying worker's open transaction"),
    ("crash", """update jobs set attempts = attempts + 1
                  where id = (select id from jobs where status = 'queued' order by id limit 1
                              for update skip locked)
                 returning id, tenant_id, attempts as attempt;
                 -- work
                 update jobs set status = 'done' where id = %(id)s;""",
     "the claim itself must skip jobs with attempts >= max_attempts"),
    ("crash", exercises.get("crash").answer.replace("-- work: the kit runs the job here "
                                                     "(the first job kills its worker)\n",
                                                     "-- work\nbegin;\n"),
     "left a transaction open"),
    ("overrun", exercises.get("overrun").starter, "guard the finish on the attempt it claimed"),
    ("overrun", """update jobs set status = 'done' where id = %(id)s
                   and locked_until > clock_timestamp()""", "the lease your finish checked is B's"),
    ("overrun", """update jobs set status = 'done' where id = %(id)s
                   and attempts = %(attempt)s and status = 'queued'""",
     "worker B owns attempt 2, and its finish matched 0 jobs"),
    ("rls-jobs", exercises.get("rls-jobs").starter, "the policy still hides the queue"),
    ("rls-jobs", "drop policy tenant_isolation on jobs", "no policy is left"),
    ("rls-jobs", "alter table jobs no force row level security", "NO FORCE exempts only"),
    ("rls-jobs", "create policy worker_reads on jobs for select to tenantlab_worker using (true)",
     "a policy FOR SELECT lets the worker only read"),
    ("noisy-neighbour", exercises.get("noisy-neighbour").starter,
     "each waited behind tenant 1's burst of 30"),
    ("noisy-neighbour", exercises.get("noisy-neighbour").answer.replace(
        "attempts = attempts + 1,", ""), "a claim counts the attempt and sets the lease"),
    ("noisy-neighbour", exercises.get("noisy-neighbour").answer.replace(
        "where tenant_id not in", "where tenant_id <> 1 and tenant_id not in"),
     "Fair is not starving the busy tenant"),
]

#: Other right answers: the fix written another way passes too.
RIGHT = [
    ("leak", "set local app.tenant = %(tenant)s"),
    ("rls-jobs", "create policy worker_claims on jobs to tenantlab_worker using (true)"),
    ("noisy-neighbour", q("claim_round_robin")),
]


@pytest.mark.parametrize("ex_id", list(exercises.EXERCISES))
def test_the_kits_answer_passes(admin_dsn: str, ex_id: str) -> None:
    ex = exercises.get(ex_id)
    outcome = ex.check(ex.answer)
    assert outcome.correct, outcome.line()
    assert outcome.checks and all(c.ok for c in outcome.checks)
    assert outcome.line().startswith("✓")


@pytest.mark.parametrize("ex_id,answer,nudge", WRONG, ids=[f"{w[0]}-{i}" for i, w in enumerate(WRONG)])
def test_a_typical_wrong_answer_gets_its_nudge(admin_dsn: str, ex_id: str, answer: str,
                                               nudge: str) -> None:
    outcome = exercises.get(ex_id).check(answer)
    assert not outcome.correct
    assert nudge in outcome.nudge, outcome.line()
    assert not outcome.error, outcome.error
    assert any(not c.ok for c in outcome.checks)
    # Never a bare ✗: the line names what was measured, and "not yet" stands for the cross.
    assert "✗" not in outcome.line() and outcome.line().startswith("not yet: ")


def test_each_exercise_has_two_wrong_answers_with_their_own_nudges() -> None:
    for ex_id in exercises.EXERCISES:
        nudges = [n for e, _, n in WRONG if e == ex_id]
        assert len(set(nudges)) >= 2, ex_id


@pytest.mark.parametrize("ex_id,answer", RIGHT)
def test_the_fix_written_another_way_passes(admin_dsn: str, ex_id: str, answer: str) -> None:
    outcome = exercises.get(ex_id).check(answer)
    assert outcome.correct, outcome.line()


@pytest.mark.parametrize("ex_id,answer,says", [
    ("leak", "alter table invoices disable row level security", "uses ALTER"),
    ("leak", "select set_config('row_security', 'off', false)", "uses ROW_SECURITY"),
    ("poison", "update jobs set status = 'dead' where kind = 'fail' returning id, attempts as attempt",
     "writes a final status"),
    ("rls-jobs", "alter table invoices disable row level security", "may only create, alter or drop"),
    ("rls-jobs", "alter role tenantlab_worker bypassrls", "uses BYPASSRLS"),
    ("rls-jobs", "commit; alter table jobs disable row level security", "runs `commit`"),
    ("noisy-neighbour", "grant update on invoices to tenantlab_worker", "uses GRANT"),
])
def test_an_answer_that_changes_the_rules_is_refused_before_it_runs(
        ex_id: str, answer: str, says: str) -> None:
    outcome = exercises.get(ex_id).check(answer)
    assert not outcome.correct
    assert outcome.line().startswith("not yet: refused: ") and says in outcome.line()
    assert [c.name for c in outcome.checks] == ["plays by the rules"]


def test_a_claim_that_edits_other_jobs_by_hand_is_refused(admin_dsn: str) -> None:
    ex = exercises.get("poison")
    cheat = "with other as (update jobs set max_attempts = 9 where id = 2)\n" + ex.answer
    outcome = ex.check(cheat)
    assert not outcome.correct
    assert "changed job 2, which it did not take" in outcome.line()


def test_the_rules_name_what_an_answer_changed(scratch: db.Scratch) -> None:
    rules = _core.Rules(scratch.admin)
    assert rules.changed() is None
    with scratch.connect("admin", autocommit=True) as conn:
        conn.execute("grant update on invoices to tenantlab_worker")
    assert "grants on invoices" in (rules.changed() or "")


@pytest.mark.parametrize("answer,starts", [
    ("selec set_config('app.tenant', %(tenant)s, true)", "not yet: syntax error in job 1's answer"),
    ("select set_config('app.tenant', %(tenant_id)s, true)",
     "not yet: job 1's answer uses a parameter it is not given"),
    ("   -- nothing but a comment\n", "not yet: your answer is empty"),
])
def test_a_broken_answer_is_one_line(admin_dsn: str, answer: str, starts: str) -> None:
    outcome = exercises.get("leak").check(answer)
    assert not outcome.correct and "\n" not in outcome.line()
    assert outcome.line().startswith(starts), outcome.line()
    assert outcome.to_json()["nudge"] == outcome.line().removeprefix("not yet: ")


def test_a_shapeless_claim_and_a_script_without_its_work_line_are_one_line(admin_dsn: str) -> None:
    shape = exercises.get("poison").check("select 1 as x")
    assert "returned columns x: a claim returns the job's id" in shape.line()
    marker = exercises.get("crash").check("update jobs set attempts = 1 where false")
    assert "needs a line starting with `-- work`" in marker.line()


def test_a_long_answer_is_stopped_by_the_statement_timeout(admin_dsn: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_core, "OPTIONS", "-c statement_timeout=300")
    monkeypatch.setattr(_core, "STATEMENT_TIMEOUT_MS", 300)
    endless = "select count(*) from generate_series(1, 1e10::bigint)"
    outcome = exercises.get("leak").check(endless)
    assert "ran longer than 0.3 s and was stopped (statement timeout)" in outcome.line()
    # An answer that lifted the server's timeout meets the client's, a second later.
    monkeypatch.setattr(_core, "OPTIONS", "")
    assert "was stopped" in exercises.get("leak").check(endless).line()


def test_an_interrupted_check_leaves_nothing_behind(admin_dsn: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ex = exercises.get("leak")

    def interrupted(answer: str, s: db.Scratch) -> None:
        with _core.worker(s, "interrupted") as conn:
            conn.execute("begin")
            conn.execute("select set_config('app.tenant', '1', false)")
            raise KeyboardInterrupt

    monkeypatch.setattr(ex, "scenario", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ex.check(ex.answer)
    mine = f"_{os.getpid()}_"
    assert not [d for d in db.scratch_databases(admin_dsn) if mine in d and "ex_leak" in d]
    assert not [b for b in db.leftover_backends(admin_dsn)
                if "exercise" in (b["application_name"] or "")]


def test_progress_hints_and_the_instructors_solutions(progress_file: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(exercises.progress()["status"]) == {"not tried"}
    _core.record("leak", False)
    _core.record("poison", True)
    _core.record("poison", False)  # a later wrong answer does not undo a ✓
    table = exercises.progress().set_index("id")
    assert table.loc["leak", "status"] == "not yet" and table.loc["poison", "status"] == "✓"
    assert table.loc["crash", "status"] == "not tried" and table.loc["poison", "tries"] == 2
    assert json.loads(progress_file.read_text())["poison"] == {"tries": 2, "correct": True}

    ex = exercises.get("overrun")
    titles = [ex.hint().title for _ in range(len(ex.hints) + 1)]
    assert titles[0] == f"Hint 1 of {len(ex.hints)}" and titles[-1] == titles[-2]
    assert "ex.solution()" in titles[-1]
    assert str(ex.solution()) == ex.answer

    assert exercises.get("08").check("").solution is None
    monkeypatch.setenv("TENANTLAB_SOLUTIONS", "1")
    shown = exercises.get("08").check("")._repr_html_()
    assert "<details open" in shown and "tenantlab-exercise" in shown
    assert "tenantlab-verdict" not in shown  # the browser test's verdict boxes are the findings'
    assert cli.parser().parse_args(["lab", "--solutions"]).solutions


def test_the_command_line_contract(admin_dsn: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["exercises", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [set(r) for r in listed] == [{"id", "notebook", "title"}] * len(exercises.EXERCISES)
    assert [r["notebook"] for r in listed] == ["01", "03", "04", "05", "08", "11"]

    assert cli.main(["exercises", "starter", "leak"]) == 0
    starter = tmp_path / "starter.sql"
    starter.write_text(capsys.readouterr().out)
    assert cli.main(["exercises", "check", "leak", "--answer", str(starter)]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("not yet: the borrower after job 1")

    assert cli.main(["exercises", "solution", "01"]) == 0
    solution = tmp_path / "solution.sql"
    solution.write_text(capsys.readouterr().out)
    assert cli.main(["exercises", "check", "01", "--answer", str(solution), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"id", "correct", "checks", "nudge"}
    assert result["id"] == "leak" and result["correct"] is True and result["nudge"] == ""
    assert {tuple(sorted(c)) for c in result["checks"]} == {("expected", "measured", "name", "ok")}

    assert cli.main(["exercises", "check", "nope", "--answer", str(solution)]) == 2
    assert "valid: leak (01)" in capsys.readouterr().err


def test_a_not_yet_box_shows_no_cross_and_is_not_a_verdict_box() -> None:
    outcome = _core.Outcome("leak", "t", checks=(_core.check("c", False, 0, 1),), nudge="n")
    html = outcome._repr_html_()
    assert "✗" not in html and outcome.line() == "not yet: n"
    assert "class='tenantlab-exercise'" in html and "tenantlab-verdict" not in html
    assert "data-ok='0'" in html and "not yet" in html


def test_nothing_of_psycopg_leaks_as_a_traceback(admin_dsn: str) -> None:
    # An error the answer provokes deep in the scenario is still one line.
    outcome = exercises.get("overrun").check("select 1/0")
    assert outcome.line().startswith("not yet: worker A's late finish failed: division by zero")
    assert isinstance(outcome, exercises.Outcome) and not outcome.checks
