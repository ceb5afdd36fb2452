"""Fair claims across tenants: ``round-robin``, or ``limit=N`` running jobs per tenant.

The FIFO claim takes the oldest eligible job: one tenant's burst of 50,000 jobs then sits in
front of every other tenant's next job (the noisy neighbour). A fair policy changes only which
job the claim takes; the claim stays one statement that counts the attempt and sets the lease,
so the fence, the heartbeat and the reaper work as before (queries ``claim_round_robin`` and
``claim_limit`` in ``sql/queries.sql``, which state each guarantee and what it does not give).
Both serve the worker's queues only, and keep priorities within a tenant: round-robin takes the
tenant's highest-priority job first, limit=N the highest-priority job of the tenants below N.

- ``round-robin``: the oldest job of the tenant served least recently. A small tenant's job
  waits about one round of the tenants with work, whatever the burst in front of it. A claim
  walks the tenants in turn order (``tenant_turns``) and finds new ones among the newest jobs
  (``WINDOW``); every ``FULL_DISCOVERY`` seconds a worker's claim also lists every tenant with
  work (one index descent each), for what the window missed.
- ``limit=N``: FIFO, skipping tenants that already run N jobs. It helps only when there are
  more workers than N: the other workers serve everyone else. A soft limit (see the query).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from .jobs import MAX_COUNT, ConfigError

POLICIES = ("round-robin", "limit=N")
#: Round-robin: the newest jobs whose tenants every claim looks for (a new job is seen by the
#: next claim unless more than this many were queued in between).
WINDOW = 32
#: Round-robin: seconds between a worker's claims that list every tenant with work (one index
#: descent per tenant: about 170 ms at 10,000 tenants on a 2-core machine, about 3 % of a worker).
FULL_DISCOVERY = 5.0
_LIMIT = re.compile(r"^limit=(\d+)$")


@dataclass(frozen=True)
class Fair:
    """A fair claim policy: its query and the parameters it adds to the claim's."""

    policy: str
    limit: int = 0
    # When this worker's claim last listed every tenant (round-robin), and whether its last
    # claim did: a clock, not the policy.
    _listed: list[float] = field(default_factory=lambda: [-math.inf, 0.0], compare=False,
                                 repr=False)

    @classmethod
    def parse(cls, text: str) -> Fair:
        """Read ``round-robin`` or ``limit=N`` (N >= 1); anything else names what is valid."""
        text = text.strip()
        if text == "round-robin":
            return cls("round-robin")
        m = _LIMIT.match(text)
        if m and 1 <= int(m.group(1)) <= MAX_COUNT:
            return cls("limit", int(m.group(1)))
        raise ConfigError(f"fair must be one of {', '.join(POLICIES)} (1 <= N <= {MAX_COUNT:,}), "
                          f"not {text!r}")

    @property
    def query(self) -> str:
        """Return the name of this policy's claim query."""
        return "claim_round_robin" if self.policy == "round-robin" else "claim_limit"

    @property
    def params(self) -> dict[str, Any]:
        """Return the parameters the policy adds to this claim (round-robin: is it a full one)."""
        if self.policy == "limit":
            return {"limit": self.limit}
        now = time.monotonic()
        full = now - self._listed[0] >= FULL_DISCOVERY
        if full:
            self._listed[0] = now
        self._listed[1] = float(full)
        return {"full": full, "window": WINDOW}

    def relist(self) -> bool:
        """After a claim that found nothing: True when it did not list every tenant, and the
        next claim will (a round-robin claim finds nothing only when a full listing does)."""
        if self.policy != "round-robin" or self._listed[1]:
            return False
        self._listed[0] = -math.inf
        return True

    def __str__(self) -> str:
        return self.policy if self.policy == "round-robin" else f"limit={self.limit}"


def fair(value: Fair | str | None) -> Fair | None:
    """Return the policy for a ``--fair`` value (None: the FIFO claim)."""
    if value is None or isinstance(value, Fair):
        return value
    return Fair.parse(value)


def flag(text: str) -> str:
    """Parse ``--fair``'s value for argparse: the policy, written the one way."""
    try:
        return str(Fair.parse(text))
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
