"""Standalone scripts, one per failing cell of a peer: each uses only that library and its
driver (no tenantlab code), so its maintainers can run it::

    python tenantlab/check/repro/pgqueuer_crash.py postgresql://user:password@host/emptydb

Each takes the URL of an empty database it may write to, prints what happened, and exits 0 when
the failure reproduced (its last line starts with ``REPRODUCED``), 1 when it did not. The
timings are shortened where the library's defaults would only make the same loop slower; each
script's docstring says which.

``SCRIPTS`` maps (queue, setting, scenario) to a script; setting ``*`` is every row of that
queue. The README links every ✗ of a peer to its script; ``tests/test_check_repro.py`` runs each
once.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

SCRIPTS: dict[tuple[str, str, str], str] = {
    ("procrastinate", "default", "crash"): "procrastinate_crash.py",
    ("procrastinate", "scaled", "crash"): "procrastinate_crash.py",
    ("procrastinate", "recommended", "crash"): "procrastinate_recipe_crash.py",
    ("procrastinate", "*", "late-finish"): "procrastinate_late_finish.py",
    ("pgqueuer", "*", "crash"): "pgqueuer_crash.py",
    ("pgqueuer", "*", "late-finish"): "pgqueuer_late_finish.py",
    ("pgqueuer", "*", "block-loop"): "pgqueuer_block_loop.py",
    ("awa", "*", "crash"): "awa_crash.py",
}


def script(queue: str, setting: str, scenario: str) -> Path | None:
    """The standalone script that reproduces a failing cell, if there is one."""
    name = SCRIPTS.get((queue, setting, scenario)) or SCRIPTS.get((queue, "*", scenario))
    return HERE / name if name else None


def all_scripts() -> list[Path]:
    """Every script, once."""
    return sorted({HERE / name for name in SCRIPTS.values()})
