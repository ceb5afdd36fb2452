"""Deprecated: ``tenantlab.jobqueue`` is now the ``jobqueue`` distribution; import ``jobqueue``.

Kept for one release so that code written against the old path, and ``python -m
tenantlab.jobqueue``, keep working: every public name and module of ``jobqueue`` is here under
its old name. Install ``pip install ./jobqueue`` (the kit's ``make`` does) and write
``import jobqueue``; this module goes in the next release.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import jobqueue
from jobqueue import *  # noqa: F403  (the whole public surface, re-exported)

__all__ = list(jobqueue.__all__)

#: The old submodule paths (``tenantlab.jobqueue.options``...): the same modules.
for _name in ("cli", "enqueue", "fair", "handlers", "heartbeat", "hooks", "jobs", "leased",
              "logs", "migrations", "ops", "options", "periodic", "preflight", "queries",
              "reaper", "tenant", "worker"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"jobqueue.{_name}")

warnings.warn("tenantlab.jobqueue is deprecated and goes in the next release: it is now the "
              "jobqueue distribution (pip install ./jobqueue); import jobqueue",
              DeprecationWarning, stacklevel=2)
