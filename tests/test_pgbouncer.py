"""Finding pgbouncer: the experiment through a real PgBouncer, the kit's pooler, and notebook 12."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest
import yaml

from notebooks import run_clean
from tenantlab import cli, db, pgbouncer, reproduce
from tenantlab.experiments import pgbouncer as finding

pytestmark = pytest.mark.slow
# CI installs Debian's pgbouncer (.ci/run): there these run. Elsewhere they say how to get it.
needs_pgbouncer = pytest.mark.skipif(not pgbouncer.installed(), reason=pgbouncer.INSTALL)


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""  # gone meanwhile


def _environ(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []  # gone meanwhile


def _no_pgbouncer_left() -> None:
    out = subprocess.run(["pgrep", "-x", "pgbouncer"], capture_output=True, text=True).stdout
    # Only pgbouncers the kit started (their ini lives in a tenantlab directory) from this test
    # process or its kernels (conftest marks their environment): not another pytest-xdist
    # worker's, nor another checkout's run on the same machine.
    ours = f"TENANTLAB_TEST_PROCESS={os.getpid()}"
    mine = [pid for pid in out.split()
            if "tenantlab-pgbouncer-" in _cmdline(pid) and ours in _environ(pid)]
    assert mine == [], f"pgbouncer processes left running: {mine}"


@needs_pgbouncer
def test_pooler_runs_in_transaction_mode_as_the_worker(scratch: db.Scratch) -> None:
    with pgbouncer.running(scratch.admin, pgbouncer.Config(pool_size=1)) as b:
        assert "pool_mode = transaction" in (b.directory / "pgbouncer.ini").read_text()
        assert "127.0.0.1" == b.host
        with psycopg.connect(b.through(scratch.worker), prepare_threshold=None,
                             autocommit=True) as conn:
            who = conn.execute("select current_user").fetchone()
            assert who == (db.WORKER,)
        proc = b.proc
        assert proc is not None and proc.poll() is None
    assert proc.returncode is not None  # stopped on the way out
    _no_pgbouncer_left()


@needs_pgbouncer
def test_pooler_stops_on_keyboard_interrupt(scratch: db.Scratch) -> None:
    procs = []
    with pytest.raises(KeyboardInterrupt):
        with pgbouncer.running(scratch.admin) as b:
            procs.append(b.proc)
            raise KeyboardInterrupt
    assert procs[0] is not None and procs[0].poll() is not None
    _no_pgbouncer_left()


def test_missing_pgbouncer_is_skipped_with_the_install_message(monkeypatch) -> None:
    monkeypatch.setenv("TENANTLAB_PGBOUNCER", "/nonexistent/pgbouncer")
    monkeypatch.delenv(pgbouncer.EXTERNAL, raising=False)
    with pytest.raises(pgbouncer.PgBouncerMissing, match="sudo apt install pgbouncer"):
        with pgbouncer.running("host=127.0.0.1 port=1 user=x password=y"):
            pass
    res = finding.run()
    assert res.measured["skipped"] == pgbouncer.INSTALL
    assert not res.verdict.valid
    assert res.verdict.headline().startswith("✗") and "skipped: pgbouncer is not installed" \
        in res.verdict.line()
    assert res.verdict.checks[0].name.startswith("skipped: ") and not res.verdict.valid


@needs_pgbouncer
def test_pgbouncer_finding_through_a_real_pooler(admin_dsn: str) -> None:
    res = finding.run(finding.Knobs(pool_size=2, processes=2, reads=60, jobs=120))
    m = res.measured
    assert m["pgbouncer_version"] == pgbouncer.version()
    # Session form: B (which sets no tenant) read under A's tenant; local form: never.
    assert m["session_form"]["reads"] == 60 and m["session_form"]["wrong_tenant_reads"] > 0
    assert m["session_form"]["from_other_process"] == m["session_form"]["wrong_tenant_reads"]
    assert m["local_form"] == {**m["local_form"], "reads": 60, "wrong_tenant_reads": 0}
    ps = m["prepared_statements"]
    assert ps["default_failed_at"] is not None and "prepare_threshold=None" in ps["fixed_by"]
    # Every job of the probe ran: how often the prepared statement failed, not only the first.
    assert ps["default_failed_jobs"][0] == ps["default_failed_at"]
    assert 1 <= ps["default_failed"] == len(ps["default_failed_jobs"]) < ps["default_jobs"]
    assert m["advisory_lock_crossed"] is True
    assert m["advisory_lock"]["b_other_server_got_lock"] is False
    assert m["listen_through_pooler_works"] is False and m["listen_direct_works"] is True
    for how in ("direct", "pgbouncer"):
        run = m["corrected_worker"][how]
        assert (run["done"], run["wrong_counts"]) == (120, 0), how
        assert m["worker_jobs_per_s"][how] > 0
    assert res.verdict.valid and res.verdict.against == "the expectation"
    script = finding.script(res, "session")
    assert {"process A", "process B"} <= set(script["who"])
    _no_pgbouncer_left()


@needs_pgbouncer
def test_pool_of_one_shares_one_server_connection(admin_dsn: str) -> None:
    res = finding.run(finding.Knobs(pool_size=1, processes=3, reads=40, jobs=60))
    m = res.measured
    assert m["session_form"]["server_connections"] == 1
    assert m["session_form"]["wrong_tenant_reads"] == 40  # every read after A's first job
    assert m["local_form"]["wrong_tenant_reads"] == 0
    assert res.verdict.valid


@needs_pgbouncer
def test_reproduce_pgbouncer_keys(admin_dsn: str) -> None:
    out = reproduce.run(["pgbouncer"], echo=False)["findings"]["pgbouncer"]
    m = out["measured"]
    assert set(m) >= {"pgbouncer_version", "session_form", "local_form", "prepared_statements",
                      "advisory_lock_crossed", "listen_through_pooler_works", "worker_jobs_per_s"}
    assert set(m["session_form"]) >= {"reads", "wrong_tenant_reads"}
    assert set(m["local_form"]) >= {"reads", "wrong_tenant_reads"}
    assert set(m["prepared_statements"]) >= {"default_failed_at", "fixed_by"}
    assert set(m["worker_jobs_per_s"]) == {"direct", "pgbouncer"}
    assert isinstance(m["advisory_lock_crossed"], bool)
    assert isinstance(m["listen_through_pooler_works"], bool)
    assert out["reproduced"] is True and out["verdict"]["valid"] is True


@needs_pgbouncer
def test_up_with_pgbouncer_starts_a_daemon_that_down_stops(admin_dsn: str, monkeypatch) -> None:
    # A state directory of its own, that the unprivileged pgbouncer user can enter.
    home = Path(tempfile.mkdtemp(prefix="tenantlab-pgbouncer-test-"))
    home.chmod(0o755)
    monkeypatch.setattr(pgbouncer, "daemon_dir", lambda: home / "pgbouncer")
    b, started = pgbouncer.start_daemon(admin_dsn)
    try:
        assert started and pgbouncer.daemon_pid() is not None
        with psycopg.connect(b.dsn("postgres"), prepare_threshold=None) as conn:
            assert conn.execute("select current_user").fetchone() == (db.WORKER,)
        assert pgbouncer.start_daemon(admin_dsn)[1] is False  # idempotent
        # Someone else's PgBouncer (docker compose's): used as it is, its settings read from
        # its console, nothing started or stopped.
        monkeypatch.setenv(pgbouncer.EXTERNAL, f"postgresql://127.0.0.1:{b.port}")
        with pgbouncer.running(admin_dsn) as ext:
            assert ext.external and ext.proc is None and ext.port == b.port
            settings = ext.settings()
            assert settings["pool_mode"] == "transaction"
            assert settings["version"] == pgbouncer.version()
        assert pgbouncer.daemon_pid() is not None
    finally:
        assert pgbouncer.stop_daemon()
    assert pgbouncer.daemon_pid() is None
    _no_pgbouncer_left()


def test_up_takes_a_pgbouncer_flag() -> None:
    assert cli.parser().parse_args(["up", "--pgbouncer"]).pgbouncer is True
    assert cli.parser().parse_args(["up"]).pgbouncer is False


def test_compose_runs_a_pinned_transaction_mode_pgbouncer() -> None:
    root = Path(__file__).resolve().parent.parent
    services = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]
    pooler = services["pgbouncer"]
    image, tag = pooler["image"].split(":")
    assert image == "edoburu/pgbouncer" and tag not in ("", "latest")
    assert pooler["environment"]["POOL_MODE"] == "transaction"
    assert pooler["environment"]["DB_HOST"] == "db"
    assert services["lab"]["environment"][pgbouncer.EXTERNAL] == "postgresql://pgbouncer:5432"
    assert services["lab"]["depends_on"]["pgbouncer"]["condition"] == "service_healthy"


@needs_pgbouncer
@pytest.mark.notebook
def test_notebook_12_runs_top_to_bottom(admin_dsn: str) -> None:
    _, text = run_clean("12-pgbouncer-transaction-mode.ipynb", admin_dsn)
    assert "✓ as the expectation says" in text and "✗ NOT" not in text
    _no_pgbouncer_left()


def test_prepared_failures_say_how_often_and_first_when() -> None:
    ps = {"default_failed_at": 12, "default_failed": 2, "default_jobs": 40,
          "default_failed_jobs": [12, 24]}
    assert finding.prepared_failures(ps) == "failed 2 of 40 jobs (jobs 12, 24), first at job 12"
    assert finding.prepared_failures({"default_failed_at": None}) == "no job failed"
    # A run stored before every job ran: only the first failure is known.
    assert finding.prepared_failures({"default_failed_at": 12}) == "failed at job 12"
