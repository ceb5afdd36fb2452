"""The root of the kit's errors: anything the CLI can say in one line without a traceback."""

from __future__ import annotations


class TenantlabError(Exception):
    """A failure the kit explains: what failed and what to do, in one or two lines."""
