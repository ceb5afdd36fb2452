"""`tenantlab lab` started headless answers on its port and stops with the server it started."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from notebooks import clone_with_filter, git
from tenantlab.server import Server, free_port


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL],
                         ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_lab_starts_headless_and_stops_cleanly(stop: signal.Signals) -> None:
    home = Path(tempfile.mkdtemp(prefix="tl-lab-", dir="/tmp"))
    home.chmod(0o755)
    port, token = free_port(), "test-token-123"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TENANTLAB_DATABASE_URL")}
    env.update(TENANTLAB_HOME=str(home), JUPYTER_CONFIG_DIR=str(home / "jupyter"))
    # JupyterLab serves a checkout set up as `make` sets it up: a save goes through its hook.
    _, checkout = clone_with_filter(home)
    env["TENANTLAB_NOTEBOOKS"] = str(checkout / "notebooks")
    log = (home / "lab.log").open("w")
    # SIGINT ignored at start, as for `make lab &`: the lab must still stop on it.
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenantlab", "lab", "--no-browser", "--port", str(port),
         "--db-port", str(free_port()), "--token", token],
        env=env, stdout=log, stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        status = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                url = f"http://127.0.0.1:{port}/api/status?token={token}"
                with urllib.request.urlopen(url, timeout=2) as r:
                    status = json.load(r)
                break
            except OSError:
                time.sleep(0.5)
        assert status is not None, (home / "lab.log").read_text()[-3000:]
        assert "started" in status
        # Without the token the API refuses: token auth is on.
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=2)
            raise AssertionError("the API answered without a token")
        except urllib.error.HTTPError as e:
            assert e.code == 403
        assert Server(home).pid() is not None, "the lab did not start the embedded server"
        if stop == signal.SIGTERM:
            _save_a_run_through_jupyterlab(port, token, checkout)
        workspaces = home / "labs" / f"{proc.pid}.workspaces"
        if stop == signal.SIGINT:
            _no_pop_ups_and_a_workspace_of_its_own(port, token, workspaces)
        if stop == signal.SIGKILL:  # kill -9 of the lab: JupyterLab must not stay an orphan
            jupyter = _jupyter_pids(port)
            assert jupyter, "JupyterLab's process not found"
            proc.kill()
            proc.wait()
            deadline = time.monotonic() + 60
            while _jupyter_pids(port) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not _jupyter_pids(port), "JupyterLab outlived the lab that started it"
            return
        proc.send_signal(stop)  # SIGINT: Ctrl-C, also when a shell started us in the background
        assert proc.wait(timeout=60) == 0
        assert Server(home).pid() is None, "the lab left the server it started running"
        assert not workspaces.exists(), "the lab left its workspace for a later lab to reopen"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        Server(home).down()
        shutil.rmtree(home, ignore_errors=True)


def _jupyter_pids(port: int) -> list[int]:
    """Return the pids of the JupyterLab serving this port (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"jupyterlab" in cmdline and f"--ServerApp.port={port}".encode() in cmdline:
            found.append(int(entry.name))
    return found


def _no_pop_ups_and_a_workspace_of_its_own(port: int, token: str, workspaces: Path) -> None:
    """JupyterLab's news and update notifications are off (tenantlab.labenv's overrides); the
    layout it saves (its open tabs) goes to this lab's own workspaces directory."""
    url = f"http://127.0.0.1:{port}/lab/api"
    plugin = "@jupyterlab/apputils-extension:notification"
    with urllib.request.urlopen(f"{url}/settings/{plugin}?token={token}", timeout=30) as r:
        shown = json.load(r)
    # The defaults JupyterLab serves (with overrides.json applied); no user setting here.
    defaults = {k: v["default"] for k, v in shown["schema"]["properties"].items()}
    assert defaults["fetchNews"] == "false" and defaults["checkForUpdates"] is False, defaults
    assert not shown["settings"], shown["settings"]
    tabs = {"data": {"layout-restorer:data": {"main": {"current": "notebook:00-start-here.ipynb"}}},
            "metadata": {"id": "default"}}
    req = urllib.request.Request(f"{url}/workspaces/default?token={token}", method="PUT",
                                 data=json.dumps(tabs).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 204
    saved = list(workspaces.glob("*.jupyterlab-workspace"))
    assert len(saved) == 1 and "00-start-here" in saved[0].read_text(), list(workspaces.parent.iterdir())


def _save_a_run_through_jupyterlab(port: int, token: str, checkout: Path) -> None:
    """Save notebook 00 as run (outputs, language_info, timings) through JupyterLab's API:
    its post-save hook keeps `git status` clean."""
    name = "00-start-here.ipynb"
    nb = json.loads((checkout / "notebooks" / name).read_text())
    nb["metadata"]["language_info"] |= {"version": "3.12.3", "mimetype": "text/x-python"}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["execution_count"] = 1
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
            cell["metadata"]["execution"] = {"shell.execute_reply": "2026-01-01T00:00:01Z"}
    body = json.dumps({"type": "notebook", "format": "json", "content": nb}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/contents/{name}?token={token}",
                                 data=body, method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    assert '"ran' in (checkout / "notebooks" / name).read_text()  # saved, outputs and all
    assert git(checkout, "status", "--porcelain") == ""


def test_the_printed_link_works_at_once_with_ipv6_and_any_token() -> None:
    """The link is printed once JupyterLab answers; it brackets an IPv6 address and encodes the
    token, so the very link printed opens the lab (no 'connection refused', no 403)."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    home = Path(tempfile.mkdtemp(prefix="tl-lab6-", dir="/tmp"))
    home.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TENANTLAB_DATABASE_URL")}
    env.update(TENANTLAB_HOME=str(home), JUPYTER_CONFIG_DIR=str(home / "jupyter"),
               JUPYTER_TOKEN="a b/&c=d?#é")
    log = (home / "lab.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenantlab", "lab", "--no-browser", "--ip", "::1",
         "--port", str(free_port()), "--db-port", str(free_port())],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline, link = time.monotonic() + 150, ""
        while not link and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            link = next((ln.split("JupyterLab: ", 1)[1] for ln in
                         (home / "lab.log").read_text().splitlines()
                         if ln.startswith("JupyterLab: ")), "")
        assert link.startswith("http://[::1]:"), (home / "lab.log").read_text()[-2000:]
        assert "a%20b%2F%26c%3Dd%3F%23%C3%A9" in link
        with urllib.request.urlopen(link, timeout=10) as r:  # at once: no retry
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        Server(home).down()
        shutil.rmtree(home, ignore_errors=True)
