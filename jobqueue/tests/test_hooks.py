"""The application's code around each job (Hooks), and the tenant setting a worker uses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import HERE, Scratch

from jobqueue import (
    Claim,
    ConfigError,
    Handlers,
    Hooks,
    Leased,
    Outcome,
    TenantContextError,
    Worker,
    WorkerOptions,
    enqueue,
    set_tenant_local,
)


class Recorder(Hooks):
    """The README's metrics counter, plus the order of the calls."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.calls: list[tuple[str, int, str]] = []

    def before_start(self, claim: Claim) -> None:
        self.calls.append(("before_start", claim.id, ""))

    def after_finish(self, claim: Claim, outcome: Outcome) -> None:
        self.counts[f"{claim.kind}.{outcome.status}"] += 1
        self.calls.append(("after_finish", claim.id, outcome.status))

    def on_failure(self, claim: Claim, outcome: Outcome, error: BaseException) -> None:
        self.counts[f"{claim.kind}.failed"] += 1
        self.calls.append(("on_failure", claim.id, f"{outcome.status}:{type(error).__name__}"))


def fail(conn: psycopg.Connection, job: Claim) -> None:
    raise RuntimeError("boom")


HANDLERS = Handlers({"ok": lambda conn, job: "fine", "fail": fail})


@pytest.fixture
def conn(scratch: Scratch):
    with scratch.connect("worker", "test hooks", autocommit=True) as c:
        yield c


def run_all(scratch: Scratch, hooks: Hooks, **options: object) -> int:
    opts = WorkerOptions(until_empty=True, listen=False, backoff=0, **options)  # type: ignore[arg-type]
    return Worker(scratch.worker, opts, HANDLERS, hooks=hooks).run()


@pytest.mark.parametrize("batch_commit", [False, True], ids=["one-by-one", "batch-commit"])
def test_each_job_gets_before_start_then_exactly_one_of_after_finish_or_on_failure(
        scratch: Scratch, conn: psycopg.Connection, batch_commit: bool) -> None:
    ok = [enqueue(conn, "ok", tenant=1) for _ in range(3)]
    bad = enqueue(conn, "fail", tenant=2, max_attempts=2)
    hooks = Recorder()
    options = {"batch": 4, "batch_commit": True} if batch_commit else {}
    run_all(scratch, hooks, **options)
    assert hooks.counts == {"ok.done": 3, "fail.failed": 2}
    for job in ok:
        assert [c for c in hooks.calls if c[1] == job] == [
            ("before_start", job, ""), ("after_finish", job, "done")]
    # The failing job: two attempts, each started, the first queued again, the second dead.
    assert [c for c in hooks.calls if c[1] == bad] == [
        ("before_start", bad, ""), ("on_failure", bad, "queued:RuntimeError"),
        ("before_start", bad, ""), ("on_failure", bad, "dead:RuntimeError")]


def test_before_start_raising_fails_the_attempt_counted_and_a_late_hook_changes_nothing(
        scratch: Scratch, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    vetoed, fine = enqueue(conn, "ok", tenant=1, max_attempts=1), enqueue(conn, "ok", tenant=1)

    class Veto(Recorder):
        def before_start(self, claim: Claim) -> None:
            super().before_start(claim)
            if claim.id == vetoed:
                raise PermissionError("not now")

        def after_finish(self, claim: Claim, outcome: Outcome) -> None:
            super().after_finish(claim, outcome)
            raise ValueError("a broken metrics backend")

    hooks = Veto()
    run_all(scratch, hooks)
    assert ("on_failure", vetoed, "dead:PermissionError") in hooks.calls
    rows = dict(conn.execute("select id, status from jobqueue.jobs").fetchall())
    # The veto failed its job (counted, dead at max_attempts 1); after_finish's error was
    # logged and the finished job stayed done.
    assert rows == {vetoed: "dead", fine: "done"}
    assert "after_finish hook failed" in caplog.text


def test_the_command_line_takes_hooks_from_the_handlers_module(scratch: Scratch,
                                                               conn: psycopg.Connection,
                                                               tmp_path: Path) -> None:
    (tmp_path / "counted.py").write_text(textwrap.dedent("""
        import sys
        from jobqueue import Handlers, Hooks

        handlers = Handlers({"ok": lambda conn, job: None})

        class Count(Hooks):
            def after_finish(self, claim, outcome):
                print(f"finished {claim.id} {outcome.status}", file=sys.stderr)

        hooks = Count()
    """))
    job = enqueue(conn, "ok", tenant=1)
    r = subprocess.run([sys.executable, "-m", "jobqueue", "worker", "--handlers", "counted",
                        "--until-empty", "--dsn", scratch.worker], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    assert f"finished {job} done" in r.stderr


# -- the tenant setting ------------------------------------------------------------------------

def test_a_worker_sets_the_tenant_in_the_setting_it_is_told(scratch: Scratch,
                                                            conn: psycopg.Connection) -> None:
    seen: list[tuple[str | None, str | None]] = []

    def look(c: psycopg.Connection, job: Claim) -> None:
        seen.append(c.execute("select current_setting('myapp.tenant_id', true), "
                              "current_setting('app.tenant', true)").fetchone())  # type: ignore[arg-type]

    enqueue(conn, "look", tenant=42)
    enqueue(conn, "look", tenant=7)
    options = WorkerOptions(until_empty=True, listen=False, tenant_setting="myapp.tenant_id")
    assert Worker(scratch.worker, options, {"look": look}).run() == 2
    assert seen == [("42", None), ("7", None)] or seen == [("42", ""), ("7", "")]
    # Local to each job: nothing is left on the session afterwards.
    with scratch.connect("worker", "test setting after") as c:
        assert c.execute("select current_setting('myapp.tenant_id', true)").fetchone()[0] in (None, "")


def test_the_tenant_setting_is_a_bound_value_and_must_be_a_custom_setting(
        conn: psycopg.Connection) -> None:
    leased = Leased({"x": lambda c, j: None}, tenant_setting="acme.tenant")
    claim = Claim(id=1, tenant_id=5, attempt=1, kind="x", payload={})
    query, params = leased.start_query(claim)
    assert "acme" not in query and params["setting"] == "acme.tenant"
    for bad in ("tenant", "app.tenant'); drop table x; --", "app. tenant", ""):
        with pytest.raises(ConfigError, match="tenant-setting"):
            WorkerOptions(tenant_setting=bad)
        with pytest.raises(ConfigError, match="tenant-setting"):
            Leased({"x": lambda c, j: None}, tenant_setting=bad)
    with conn.transaction():
        set_tenant_local(conn, 9, "acme.tenant")
        assert conn.execute("select current_setting('acme.tenant')").fetchone() == ("9",)
        with pytest.raises(TenantContextError, match="tenant-setting"):
            set_tenant_local(conn, 9, "acme")
    r = subprocess.run([sys.executable, "-m", "jobqueue", "worker", "--tenant-setting", "nodot",
                        "--dsn", "host=nowhere.invalid"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "tenant-setting" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_readmes_metrics_counter_counts_what_the_worker_ran(scratch: Scratch,
                                                               conn: psycopg.Connection) -> None:
    readme = (HERE.parent / "README.md").read_text()
    block = readme.split("### Hooks: your code around each job")[1].split("\n\n    # ")[1]
    code = "# " + block.split("\n\n`before_start`")[0]
    example: dict[str, Any] = {}
    exec(textwrap.dedent("    " + code), example)  # the README's code, as written
    metrics = example["hooks"]
    assert isinstance(metrics, Hooks)
    for _ in range(2):
        enqueue(conn, "ok", tenant=1)
    enqueue(conn, "fail", tenant=1, max_attempts=1)
    run_all(scratch, metrics)
    assert metrics.counts == {"ok.started": 2, "ok.done": 2, "fail.started": 1, "fail.failed": 1}
