"""The heartbeat of the corrected worker, as the lab and notebook 05 name it.

It lives in the production package (``tenantlab/jobqueue/heartbeat.py``): one thread and one
connection per worker extend the lease of every job it holds, only for the attempt it claimed,
until the work ends, the fence says the lease was lost, or the maximum runtime is reached.
"""

from __future__ import annotations

from .jobqueue.heartbeat import (
    Heartbeat,
    HeartbeatConfig,
    HeartbeatError,
    Heartbeats,
    Held,
    check,
    dsn_of,
)

__all__ = ["Heartbeat", "HeartbeatConfig", "HeartbeatError", "Heartbeats", "Held", "check", "dsn_of"]
