"""Execute a notebook top to bottom in a fresh kernel, as a workshop participant would."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from tenantlab import labenv

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
#: Where each notebook's last run time is kept; tools/notebook_timings.py writes the README's table.
TIMINGS = Path(__file__).resolve().parent.parent / "test-output" / "notebook-seconds.json"


def run_notebook(path: Path, timeout: int = 300, env: dict[str, str] | None = None
                 ) -> nbformat.NotebookNode:
    """Run every cell (per-cell timeout in seconds); raise CellExecutionError on the first error."""
    nb = nbformat.read(path, as_version=4)
    # The kernel inherits os.environ: point it at the suite's server, at workshop size.
    saved = dict(os.environ)
    os.environ.update(env or {})
    os.environ.setdefault("TENANTLAB_SIZE", "workshop")
    try:
        # The kernel the notebook names ("tenantlab", in this environment), as nbconvert and
        # JupyterLab start it: a user's own python3 kernelspec cannot stand in for it.
        labenv.install()
        client = NotebookClient(nb, timeout=timeout, kernel_name=nb.metadata.kernelspec.name,
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


def errors(nb: nbformat.NotebookNode) -> list[str]:
    """Return the error outputs of an executed notebook (should be empty)."""
    return [
        f"{o.get('ename')}: {o.get('evalue')}"
        for c in nb.cells if c.cell_type == "code"
        for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]


def printed(nb: nbformat.NotebookNode) -> str:
    """Return everything the executed notebook's cells printed or showed as plain text."""
    return "\n".join(
        o.get("text", "") if o.get("output_type") == "stream"
        else o.get("data", {}).get("text/plain", "")
        for c in nb.cells if c.cell_type == "code"
        for o in c.get("outputs", []) if o.get("output_type") in
        ("stream", "display_data", "execute_result")
    )


def run_clean(name: str, dsn: str) -> tuple[nbformat.NotebookNode, str]:
    """Run notebooks/<name> against the server at dsn; assert no cell failed.

    Return the executed notebook and everything it printed (verdicts are printed lines).
    """
    started = time.perf_counter()
    nb = run_notebook(NOTEBOOKS / name, env={"TENANTLAB_DATABASE_URL": dsn})
    assert errors(nb) == [], f"{name}: {errors(nb)}"
    record(name, time.perf_counter() - started)
    return nb, printed(nb)


def record(name: str, seconds: float) -> None:
    """Keep how long notebook `name` took, top to bottom (a record, never asserted)."""
    import fcntl

    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    # Under a lock: the suite's two pytest-xdist workers may each finish a notebook at once.
    with open(TIMINGS.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        times = json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}
        times[name] = round(seconds, 1)
        TIMINGS.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")


def git(cwd: Path, *args: str) -> str:
    """Run git in cwd (any identity for commits); return its stdout, raise on failure."""
    import subprocess

    done = subprocess.run(["git", "-c", "user.name=tenantlab test", "-c", "user.email=t@example.com",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr.strip()}"
    return done.stdout


def clone_with_filter(tmp: Path) -> tuple[Path, Path]:
    """Return (upstream, checkout): clones of this repository's HEAD in tmp, the checkout with
    the notebook filter set up as `make` sets it up, pulling from upstream."""
    import subprocess

    root = NOTEBOOKS.parent
    upstream, checkout = tmp / "upstream", tmp / "checkout"
    git(tmp, "clone", "--quiet", str(root), str(upstream))
    git(tmp, "clone", "--quiet", str(upstream), str(checkout))
    # A clone's files are as new as its index, so git would re-read each one through the filter
    # (a python3 each) on its next look; a checkout as old as a participant's is not.
    past = time.time() - 10
    for path in (checkout / "notebooks").iterdir():
        os.utime(path, (past, past))
    git(checkout, "update-index", "-q", "--refresh")
    subprocess.run(["sh", "tools/setup_git_filter.sh"], cwd=checkout, check=True,
                   capture_output=True, timeout=60)
    return upstream, checkout


def pull_after_save(tmp: Path, name: str, saved: str) -> str:
    """Save `saved` as notebooks/<name> in a filtered clone as JupyterLab does (its post-save
    hook included), commit an upstream change to the same notebook, pull it; return
    `git status --porcelain` as it was between the save and the pull."""
    import json as json_

    from tenantlab import gitsave

    upstream, checkout = clone_with_filter(tmp)
    (checkout / "notebooks" / name).write_text(saved)
    assert gitsave.refresh(checkout / "notebooks" / name)
    status = git(checkout, "status", "--porcelain")
    # Upstream edits the same notebook (its last cell): the pull must go through.
    path = upstream / "notebooks" / name
    nb = json_.loads(path.read_text())
    nb["cells"][-1]["source"].append("\n")
    nb["cells"][-1]["source"].append("Changed upstream.")
    path.write_text(json_.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    git(upstream, "commit", "--quiet", "-am", "upstream edits the notebook")
    git(checkout, "pull", "--quiet", "--no-rebase")
    assert "Changed upstream." in (checkout / "notebooks" / name).read_text()
    return status
