"""The reaper of the corrected worker, as the lab names it (``tenantlab/jobqueue/reaper.py``).

It moves jobs whose lease expired out of ``running``: dead when exhausted (finding ``crash``),
else, with ``requeue``, back to queued. It decides by the clock, so a live worker slower than
its lease looks dead (finding ``overrun``); the fence keeps that worker's late writes out.
"""

from __future__ import annotations

from .jobqueue.reaper import Reaper, ReaperConfig, prune

__all__ = ["Reaper", "ReaperConfig", "prune"]
