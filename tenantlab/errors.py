"""The root of the kit's errors: anything the CLI can say in one line without a traceback."""

from __future__ import annotations


class TenantlabError(Exception):
    """A failure the kit explains: what failed and what to do, in one or two lines."""


class ConfigurationError(TenantlabError):
    """Bad input: a flag, an environment variable, or a server that refuses the login or has no
    such database. Nothing was started; the CLI exits 2 (as jobqueue's ConfigError does)."""
