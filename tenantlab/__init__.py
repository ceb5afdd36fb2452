"""tenantlab: how a multi-tenant background worker on PostgreSQL goes wrong, measured live."""

from .db import Scratch, admin_dsn, ensure_template, scratch
from .server import ServerError, ServerNotRunning

__all__ = ["Scratch", "ServerError", "ServerNotRunning", "admin_dsn", "ensure_template", "scratch"]
__version__ = "0.1.0"
