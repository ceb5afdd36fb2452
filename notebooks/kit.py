"""The notebooks' first import: the kit's ``tenantlab.nb``, or one line saying which kernel to pick.

A notebook opened with another kernel (a ``python3`` of the user's own, another environment)
has no ``tenantlab`` to import: instead of a traceback, its first cell then says which kernel
to choose. Standard library only, for that reason.
"""

from __future__ import annotations

import sys

try:
    import tenantlab.nb as nb
except ModuleNotFoundError as e:
    class WrongKernel(Exception):
        """Shown by IPython as its one line (``_render_traceback_``), not as a traceback."""

        def _render_traceback_(self) -> list[str]:
            return [f"\x1b[31m{self}\x1b[0m"]

    missing = (e.name or "tenantlab").split(".")[0]
    raise WrongKernel(
        f"this kernel ({sys.executable}) has no module {missing!r}: pick the kernel "
        "\u201ctenantlab (Python 3.\u2026)\u201d (Kernel \u203a Change Kernel\u2026) in the lab "
        "`make lab` starts") from None

__all__ = ["nb"]
