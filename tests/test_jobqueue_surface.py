"""The kit uses jobqueue through its declared surface only: ``jobqueue.__all__``.

A name the kit imports from jobqueue (or reaches as an attribute of it) must be in
``jobqueue.__all__``, or in the ``__all__`` of one of the public modules listed there. Anything
else may change under the kit in any release of jobqueue. And the old path,
``tenantlab.jobqueue``, still works for one release, saying it is deprecated.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import jobqueue

ROOT = Path(__file__).resolve().parent.parent
ALIAS = ROOT / "tenantlab" / "jobqueue"  # the deprecated re-export: all of it, on purpose


def _public(module: str) -> ModuleType | None:
    """The public module ``jobqueue.<module>``, or None when it is not one."""
    if module not in jobqueue.__all__:
        return None
    found = getattr(jobqueue, module)
    return found if isinstance(found, ModuleType) else None


def outside_the_surface(source: str) -> list[str]:
    """Return ``line: name`` for each use of jobqueue in `source` that is not declared public."""
    tree = ast.parse(source)
    bad: list[str] = []
    bound: dict[str, ModuleType] = {}  # a local name -> the jobqueue module it is bound to

    def check(owner: ModuleType, name: str, line: int) -> None:
        if not name.startswith("__") and name not in owner.__all__:
            bad.append(f"{line}: {owner.__name__}.{name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "jobqueue":
                    bound[a.asname or "jobqueue"] = jobqueue
                elif a.name.startswith("jobqueue."):
                    sub = _public(a.name.split(".", 1)[1])
                    if sub is None:
                        bad.append(f"{node.lineno}: {a.name}")
                    elif a.asname:
                        bound[a.asname] = sub
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "jobqueue":
            if node.module == "jobqueue":
                owner: ModuleType | None = jobqueue
            else:
                owner = _public(node.module.split(".", 1)[1])
                if owner is None or "." in node.module.split(".", 1)[1]:
                    bad.append(f"{node.lineno}: {node.module}")
                    continue
            assert owner is not None
            for a in node.names:
                check(owner, a.name, node.lineno)
                sub = _public(a.name) if owner is jobqueue else None
                if sub is not None:
                    bound[a.asname or a.name] = sub
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in bound:
            check(bound[node.value.id], node.attr, node.lineno)
    return bad


def kit_sources() -> dict[str, str]:
    """Every Python source of the kit (package, tools, notebooks' code cells), by path."""
    out = {}
    for path in [*sorted((ROOT / "tenantlab").rglob("*.py")), *sorted((ROOT / "tools").glob("*.py"))]:
        if not path.is_relative_to(ALIAS):
            out[str(path.relative_to(ROOT))] = path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        # IPython magics and shell lines are not Python: left out.
        out[str(path.relative_to(ROOT))] = "\n".join(
            ln for block in code for ln in block.splitlines() if not ln.lstrip().startswith(("%", "!")))
    return out


def test_the_kit_imports_from_jobqueue_only_what_its_all_declares() -> None:
    bad = {path: names for path, source in kit_sources().items()
           if (names := outside_the_surface(source))}
    assert bad == {}, "declare these in jobqueue.__all__ (on purpose) or move them to the kit"


def test_the_check_catches_a_private_name_a_private_module_and_an_attribute() -> None:
    assert outside_the_surface("from jobqueue import Worker, enqueue\nfrom jobqueue.ops import stats") == []
    assert outside_the_surface("from jobqueue.worker import APP") == ["1: jobqueue.worker"]
    assert outside_the_surface("from jobqueue.options import _flag") == ["1: jobqueue.options._flag"]
    assert outside_the_surface("from jobqueue import leased") == ["1: jobqueue.leased"]
    assert outside_the_surface("import jobqueue as jq\njq.jobs.MAX_COUNT") == ["2: jobqueue.jobs"]
    assert outside_the_surface("from jobqueue import ops\nops.table([], [])") == ["2: jobqueue.ops.table"]
    assert outside_the_surface("import jobqueue.heartbeat") == ["1: jobqueue.heartbeat"]


def test_the_deprecated_path_still_works_for_one_release_and_says_so() -> None:
    # pytest turns warnings into errors: the alias is imported in a process of its own.
    warned = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c",
                             "import tenantlab.jobqueue"], capture_output=True, text=True,
                            timeout=60)
    assert warned.returncode == 1 and "DeprecationWarning: tenantlab.jobqueue is deprecated" \
        in warned.stderr, warned.stderr
    old = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c",
                          "import jobqueue, tenantlab.jobqueue as old\n"
                          "from tenantlab.jobqueue.options import WorkerOptions\n"
                          "from tenantlab.jobqueue import Worker, enqueue\n"
                          "assert Worker is jobqueue.Worker and enqueue is jobqueue.enqueue\n"
                          "assert WorkerOptions is jobqueue.WorkerOptions\n"
                          "assert sorted(old.__all__) == sorted(jobqueue.__all__)\n"],
                         capture_output=True, text=True, timeout=60)
    assert old.returncode == 0, old.stderr
    cli = subprocess.run([sys.executable, "-m", "tenantlab.jobqueue", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and "migrate" in cli.stdout, cli.stderr
    assert cli.stderr.strip().splitlines() == [
        "python -m tenantlab.jobqueue is deprecated and goes in the next release: run `jobqueue` "
        "(or python -m jobqueue), the same commands"]
