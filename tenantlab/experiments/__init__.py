"""The registry of findings: one entry per finding id, in the article's order.

Every finding module keeps the contract of :mod:`tenantlab.finding` (``CLAIM``, ``ARTICLE``,
``Knobs``, ``run``, ``judge``). ``reproduce``, the report, the notebooks' verdict cells, the
explorers and the tests reach a finding through :func:`get`; a new finding is one module, one
notebook and one line in ``REGISTRY``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..errors import TenantlabError
from ..finding import Knobs, Result


@dataclass(frozen=True)
class Entry:
    """One registered finding: its id, module and notebook."""

    id: str
    module_name: str
    notebook: str

    @property
    def module(self) -> ModuleType:
        return importlib.import_module(f"{__name__}.{self.module_name}")

    @property
    def claim(self) -> str:
        return str(self.module.CLAIM)

    @property
    def article(self) -> dict[str, Any]:
        return dict(self.module.ARTICLE)

    def knobs(self, full: bool | None = None, **overrides: Any) -> Knobs:
        """Return this finding's knobs, some values changed: the article's sizes when full,
        workshop size when not, and the size TENANTLAB_SIZE asks for when None."""
        kind: type[Knobs] = self.module.Knobs
        return kind.of(full, **overrides)

    def run(self, knobs: Knobs | None = None, *, full: bool | None = None, live: Any = None,
            progress: Any = None) -> Result:
        """Run the finding's experiment once, live, and return its measured result."""
        result: Result = self.module.run(knobs or self.knobs(full), live=live, progress=progress)
        return result


# finding id -> (module under tenantlab.experiments, notebook), in the article's order.
REGISTRY: dict[str, Entry] = {e.id: e for e in (
    Entry("leak", "leak", "01-tenant-context-leak.ipynb"),
    Entry("reset", "reset", "02-cleanup-cost.ipynb"),
    Entry("poison", "poison", "03-poison-pill.ipynb"),
    Entry("crash", "crash", "04-worker-crash.ipynb"),
    Entry("overrun", "overrun", "05-lease-overrun.ipynb"),
    Entry("vacuum", "vacuum", "06-long-transactions-and-vacuum.ipynb"),
    Entry("horizon", "horizon", "07-the-horizon-and-a-slow-queue.ipynb"),
    Entry("rls-jobs", "rls_jobs", "08-rls-on-the-jobs-table.ipynb"),
    Entry("vanish", "vanish", "10-a-worker-vanishes.ipynb"),
    Entry("restart", "restart", "10-a-worker-vanishes.ipynb"),
    Entry("workers", "workers", "11-the-noisy-neighbour.ipynb"),
    Entry("noisy-neighbour", "noisy_neighbour", "11-the-noisy-neighbour.ipynb"),
    Entry("pgbouncer", "pgbouncer", "12-pgbouncer-transaction-mode.ipynb"),
)}


#: Modules here that are not findings: demonstrations a notebook runs, with no claim of the
#: article's to judge and so no place in ``reproduce``. ``together`` (notebook 09) runs every
#: fault at once against the naive and the corrected worker: it shows the findings' fixes
#: working together; each fault's claim is judged by its own finding above.
DEMONSTRATIONS: dict[str, str] = {"together": "09-what-we-would-build.ipynb"}


class UnknownFinding(TenantlabError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def get(finding: str) -> Entry:
    """Return the registered finding `finding`; an unknown id names the valid ones."""
    if finding not in REGISTRY:
        raise UnknownFinding(f"unknown finding {finding!r}; valid ids: {', '.join(REGISTRY)}")
    return REGISTRY[finding]


def module(finding: str) -> ModuleType:
    """Return the module of a registered finding id."""
    return get(finding).module
