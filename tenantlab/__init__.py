"""tenantlab: how a multi-tenant background worker on PostgreSQL goes wrong, measured live."""

from __future__ import annotations

from typing import Any

__all__ = ["Scratch", "ServerError", "ServerNotRunning", "admin_dsn", "ensure_template", "scratch"]
__version__ = "0.1.0"

_LAZY = {"Scratch": "db", "admin_dsn": "db", "ensure_template": "db", "scratch": "db",
         "ServerError": "server", "ServerNotRunning": "server"}


def __getattr__(name: str) -> Any:
    # Lazy: importing a submodule (the deprecated tenantlab.jobqueue alias) loads nothing else.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'tenantlab' has no attribute {name!r}")
