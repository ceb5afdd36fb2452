"""Finding restart: crash restarts of a throwaway cluster under both designs' worker processes.

Nothing lost, nothing finished twice, no production worker exits; repeated calls are counted
and the idempotency key takes effect once per job. The lab's server is never restarted, and
no cluster, worker process or temporary directory is left behind, also when interrupted.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_vanish import assert_nothing_left

from tenantlab import outside, reproduce
from tenantlab.events import NullLog
from tenantlab.experiments import _cluster, restart

pytestmark = pytest.mark.slow

REQUIRED = {"jobs", "lost", "finished_twice", "side_effects_repeated",
            "effects_with_idempotency_key", "workers_exited", "recovered_s"}


def test_the_outside_world_deduplicates_on_the_key(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(outside.FILE_ENV, str(tmp_path / "calls.jsonl"))
    for attempt in (1, 2, 1):
        job = SimpleNamespace(id=7, attempt=attempt, worker="w", payload={},
                              events=NullLog("w"))
        outside.call_once(None, job)  # type: ignore[arg-type]
    calls = outside.read(tmp_path / "calls.jsonl")
    assert len(calls) == 3 and [c["effect"] for c in calls] == [True, False, False]
    assert {c["key"] for c in calls} == {"job-7"}


def test_restarts_lose_nothing_and_the_key_dedupes(admin_dsn: str) -> None:
    res = restart.run(restart.Knobs.of(jobs=150))
    m = res.measured
    assert REQUIRED <= set(m)
    assert m["jobs"] == 150
    assert m["lost"] == 0 and m["finished_twice"] == 0
    assert m["workers_exited"]["production"] == 0
    assert m["calls_made"] == m["jobs"] + m["side_effects_repeated"]
    assert m["effects_with_idempotency_key"] == m["jobs"]
    assert m["naive"]["lost"] == 0 and m["naive"]["finished_twice"] == 0
    assert [r["when"] for r in m["restarts"]] == ["an arbitrary moment", "right after a claim"]
    assert m["claimed_job"]["status"] == "done"
    assert m["recovered_s"] > 0
    assert m["repeated_within_an_attempt"] == 0
    assert res.verdict.valid, res.verdict.line()
    assert restart.judge(m, res.knobs).valid
    # The causes removed, from this run's naive queue (its claim rolls back with a crash, so a
    # retry is the same attempt again) and from its calls without the key (each one an effect):
    # judged as the production queue, the checks they bear on fail when a call was repeated.
    n = m["naive"]
    without_counted_claim = restart.judge({**m, "repeated_within_an_attempt":
                                           n["repeated_within_an_attempt"]})
    without_key = restart.judge({**m, "effects_with_idempotency_key": m["calls_made"]})
    assert without_counted_claim.valid is (n["repeated_within_an_attempt"] == 0)
    assert without_key.valid is (m["side_effects_repeated"] == 0)
    assert_nothing_left(admin_dsn)


def test_an_interrupted_restart_run_removes_its_cluster(admin_dsn: str) -> None:
    def stop(n: int = 1) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        restart.run(restart.Knobs.of(jobs=100), progress=stop)
    assert_nothing_left(admin_dsn)
    assert _cluster.leftovers() == []


def test_reproduce_keys_for_vanish_and_restart_without_running() -> None:
    # The JSON keys are a contract: the skipped form still judges, and says why.
    m = {"skipped": "no throwaway cluster here: postgresql binaries missing"}
    assert not restart.judge(m).valid
    assert {"vanish", "restart"} <= set(reproduce.REGISTRY)
    assert os.path.exists(Path(__file__).parent.parent / "notebooks" /
                          reproduce.REGISTRY["restart"].notebook)
