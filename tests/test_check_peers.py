"""The peer adapters (procrastinate, PgQueuer, awa): their rows offline, then each one live on
its own: install its schema, queue an ``ok`` and a ``poison`` job, run one worker process (and
the maintenance process its row needs), and read what happened from the history and from the
library's own tables. A library that is not installed is skipped."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tenantlab import db
from tenantlab.check import adapter, history
from tenantlab.check.adapter import Options
from tenantlab.check.queues import _peers

PEERS = ("procrastinate", "pgqueuer", "awa")
ROOT = Path(__file__).resolve().parent.parent


def _rows(name: str) -> list[adapter.Adapter]:
    return importlib.import_module(f"tenantlab.check.queues.{name}").rows()


@pytest.mark.parametrize("name", PEERS)
def test_rows_say_what_they_set_and_where_the_docs_say_so(name: str) -> None:
    rows = _rows(name)
    assert [r.setting for r in rows] == ["default", "scaled", "recommended"]
    for r in rows:
        assert isinstance(r, adapter.Adapter) and r.name == name
        assert set(r.settings) <= set(r.links), f"{name} {r.setting}: a setting without a link"
        assert all(u.startswith("https://") for u in r.links.values())
        assert r.promises.endswith(".") and "pip install" in r.install_hint
        assert "tenant-hook" not in r.features  # none of the three has a per-job hook
        argv = r.worker_command("dbname=x", "/tmp/h", Options())
        assert argv[:3] == [sys.executable, "-m", f"tenantlab.check.queues.{name}"]
        assert "worker" in argv and "--history" in argv
        quoted = [v for v in r.settings.values() if isinstance(v, dict)]
        if r.setting == "recommended":
            # Every recommended setting that differs from the defaults quotes its docs.
            assert quoted and all(v["source"]["url"].startswith("https://")
                                  and len(v["source"]["quote"]) > 20 for v in quoted)
        else:
            assert not quoted
    needs_sweep = [r.setting for r in rows if r.maintenance_command("dbname=x", Options())]
    assert needs_sweep == (["recommended"] if name == "procrastinate" else [])


def test_the_registry_lists_the_peers_even_without_their_libraries() -> None:
    # Block the three libraries' imports: the adapters still import, list their rows, and say
    # they are not installed.
    code = (
        "import sys\n"
        "for m in ('procrastinate', 'pgqueuer', 'asyncpg', 'awa'): sys.modules[m] = None\n"
        "from tenantlab.check import adapter\n"
        "rows = [r for r in adapter.rows(['procrastinate', 'pgqueuer', 'awa'])]\n"
        "print(len(rows), sorted({r.name for r in rows}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "9 ['awa', 'pgqueuer', 'procrastinate']"


def test_dsn_becomes_a_url_for_the_drivers_that_read_only_urls() -> None:
    assert _peers.url("host=127.0.0.1 port=5 user=u password=p@s dbname=d", "check w") == (
        "postgresql://u:p%40s@127.0.0.1:5/d?application_name=tenantlab+check+w")
    assert _peers.url("host=/run/pg user=u dbname=d") == "postgresql://u@/d?host=%2Frun%2Fpg"


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _sessions(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("select application_name from pg_stat_activity"
                            " where application_name like 'tenantlab check %'"
                            " or application_name like 'tenantlab suite %'").fetchall()
    return [r[0] for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("name", PEERS)
def test_one_worker_runs_ok_and_poison(name: str, admin_dsn: str, tmp_path: Path) -> None:
    row = _rows(name)[2]  # recommended: retries, and procrastinate's sweep process too
    if row.version() is None:
        pytest.skip(f"{name} is not installed: {row.install_hint}")
    options = Options(lease=2.0, max_attempts=2)
    hist = str(tmp_path / "history.jsonl")
    procs: list[subprocess.Popen[bytes]] = []
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with db.scratch(f"peer_{name}", admin_dsn) as s:
        row.install(s.admin)
        ok = row.enqueue(s.admin, "ok", 7, {}, options)
        poison = row.enqueue(s.admin, "poison", 8, {}, options)
        assert row.states(s.admin) == {ok: "queued", poison: "queued"}
        try:
            procs.append(subprocess.Popen(row.worker_command(s.admin, hist, options), env=env,
                                          stderr=subprocess.DEVNULL))
            if sweep := row.maintenance_command(s.admin, options):
                procs.append(subprocess.Popen(sweep, env=env, stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + 25
            while time.monotonic() < deadline:
                states = row.states(s.admin)
                if states.get(ok) == "done" and states.get(poison) in adapter.TERMINAL:
                    break
                time.sleep(0.3)
        finally:
            _stop(procs)
        assert all(p.returncode is not None for p in procs)
        runs = history.by_job(history.read(hist))
        assert [(e.outcome, e.attempt, e.tenant) for e in runs[ok]] == [("ok", 1, 7)]
        # Two attempts, as max_attempts says, each counted by the library, then failed.
        assert [(e.outcome, e.attempt) for e in runs[poison]] == [("error", 1), ("error", 2)]
        assert {e.pid for e in runs[ok] + runs[poison]} == {procs[0].pid}
        assert row.states(s.admin) == {ok: "done", poison: "failed"}
        name_of_db = s.name
    assert name_of_db not in db.scratch_databases(admin_dsn)
    assert _sessions(admin_dsn) == []
