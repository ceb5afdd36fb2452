"""Execute a notebook top to bottom in a fresh kernel, as a workshop participant would."""

from __future__ import annotations

import copy
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.util import run_sync

from tenantlab import labenv

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
#: Where each notebook's last run time is kept; tools/notebook_timings.py writes the README's table.
TIMINGS = Path(__file__).resolve().parent.parent / "test-output" / "notebook-seconds.json"
#: What the second, out-of-order pass took per notebook (a record, never asserted).
AGAIN = TIMINGS.with_name("notebook-again-seconds.json")
#: The second pass may take this share of the first run: the cheap cells always, a dear one
#: (an experiment) when the budget still holds it. TENANTLAB_TEST_AGAIN_SHARE=1 runs every cell
#: twice (about twice the time: to look for trouble, not for `make test`).
AGAIN_SHARE = float(os.environ.get("TENANTLAB_TEST_AGAIN_SHARE", "0.4"))
#: A cell that took less than this (seconds) is always run again.
CHEAP = 1.0


class WorkshopClient(NotebookClient):
    """Run every cell top to bottom, then, in the same kernel, cells again out of order, as a
    workshop does (a part run again after a later one, a cell re-run to look again): a cell that
    fails the second time (a name another part reused, a state it assumed) raises as the first
    run would. Each cell's second output is dropped: the run's outputs stay the first pass's."""

    #: The second pass's shuffle seed (the notebook's name): the same order every run.
    seed: str = ""
    again: list[int]
    first_seconds: float = 0.0
    again_seconds: float = 0.0

    async def async_execute(self, reset_kc: bool = False, **kwargs: Any) -> nbformat.NotebookNode:
        self.reset_execution_trackers()
        async with self.async_setup_kernel(**kwargs):
            assert self.kc is not None
            info = await self.async_wait_for_reply(await _maybe_await(self.kc.kernel_info()))
            if info is not None:
                self.nb.metadata["language_info"] = info["content"]["language_info"]
            took: dict[int, float] = {}
            for index, cell in enumerate(self.nb.cells):
                started = time.perf_counter()
                await self.async_execute_cell(cell, index,
                                              execution_count=self.code_cells_executed + 1)
                took[index] = time.perf_counter() - started
            self.first_seconds = sum(took.values())
            self.again = again_order(self.nb, took, seed=self.seed)
            started = time.perf_counter()
            for index in self.again:
                await self.async_execute_cell(copy.deepcopy(self.nb.cells[index]), index)
            self.again_seconds = time.perf_counter() - started
            self.set_widgets_metadata()
        return self.nb

    execute = run_sync(async_execute)


async def _maybe_await(value: Any) -> Any:
    import inspect

    return await value if inspect.isawaitable(value) else value


def again_order(nb: nbformat.NotebookNode, took: dict[int, float], seed: str,
                share: float = AGAIN_SHARE) -> list[int]:
    """Return the code cells to run a second time, in a shuffled order (seeded: the same each
    run of a notebook): every cheap cell, and dear ones while the second pass stays within
    `share` of the first run's time. The first cell comes first (a participant back from a
    break runs it again)."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    if not code:
        return []
    first, rest = code[0], code[1:]
    random.Random(seed).shuffle(rest)
    budget = share * sum(took.values())
    chosen, spent = [first], took.get(first, 0.0)
    for index in rest:
        if took.get(index, 0.0) < CHEAP or spent + took.get(index, 0.0) <= budget:
            chosen.append(index)
            spent += took.get(index, 0.0)
    return chosen


def run_notebook(path: Path, timeout: int = 300, env: dict[str, str] | None = None,
                 times: dict[str, float] | None = None) -> nbformat.NotebookNode:
    """Run every cell, then some again out of order (WorkshopClient; per-cell timeout in
    seconds); raise CellExecutionError on the first error. `times`: filled with the seconds of
    the first pass and of the second."""
    nb = nbformat.read(path, as_version=4)
    # The kernel inherits os.environ: point it at the suite's server, at workshop size.
    saved = dict(os.environ)
    os.environ.update(env or {})
    os.environ.setdefault("TENANTLAB_SIZE", "workshop")
    try:
        # The kernel the notebook names ("tenantlab", in this environment), as nbconvert and
        # JupyterLab start it: a user's own python3 kernelspec cannot stand in for it.
        labenv.install()
        client = WorkshopClient(nb, timeout=timeout, kernel_name=nb.metadata.kernelspec.name,
                                resources={"metadata": {"path": str(path.parent)}})
        client.seed = path.name
        client.execute()
        if times is not None:
            times.update(first=client.first_seconds, again=client.again_seconds)
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
    started, times = time.perf_counter(), {"again": 0.0}
    nb = run_notebook(NOTEBOOKS / name, env={"TENANTLAB_DATABASE_URL": dsn}, times=times)
    assert errors(nb) == [], f"{name}: {errors(nb)}"
    # Top to bottom in a fresh kernel (its start included), as the README's table says.
    record(name, time.perf_counter() - started - times["again"])
    record(name, times["again"], AGAIN)
    return nb, printed(nb)


def record(name: str, seconds: float, where: Path = TIMINGS) -> None:
    """Keep how long notebook `name` took, top to bottom (a record, never asserted)."""
    import fcntl

    where.parent.mkdir(parents=True, exist_ok=True)
    # Under a lock: the suite's two pytest-xdist workers may each finish a notebook at once.
    with open(where.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        times = json.loads(where.read_text()) if where.exists() else {}
        times[name] = round(seconds, 1)
        where.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")


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
