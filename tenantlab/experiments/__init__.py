"""One module per finding id; ``FINDINGS`` lists them in the article's order.

A finding module defines:

- ``CLAIM``: the article's claim in one sentence;
- ``ARTICLE``: the article's numbers, as a dict (what ``reproduce --json`` shows beside ours);
- ``reproduce(full: bool = False) -> dict`` returning ``{"measured": {...}, "reproduced": bool,
  "summary": "one line of what was measured here"}``, computed from a live run.

Notebooks, tests and ``tenantlab reproduce`` call the same experiment functions.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# finding id -> module name under tenantlab.experiments, in the article's order.
FINDINGS: dict[str, str] = {
    "leak": "leak",
    "reset": "reset",
    "poison": "poison",
    "crash": "crash",
    "overrun": "overrun",
    "vacuum": "vacuum",
    "horizon": "horizon",
    "rls-jobs": "rls_jobs",
}


def module(finding: str) -> ModuleType:
    """Return the module of a registered finding id."""
    if finding not in FINDINGS:
        valid = ", ".join(FINDINGS) or "none registered yet"
        raise KeyError(f"unknown finding {finding!r}; valid ids: {valid}")
    return importlib.import_module(f"{__name__}.{FINDINGS[finding]}")
