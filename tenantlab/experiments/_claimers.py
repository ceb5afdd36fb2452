"""Worker processes for the ``workers`` finding: started once, told per round how many work.

``python -m tenantlab.experiments._claimers INDEX EVENTS`` (DSN in ``TENANTLAB_DSN``) listens on
``tenantlab_claimers``. A notification ``go ROUND WORKERS CLAIM`` makes the processes with an
index below WORKERS drain the queue: the claim on its own (``skip``: the production claim,
``FOR UPDATE SKIP LOCKED``; ``plain``: the lab's ``claim_plain``), timed, then the production
execute (tenant set locally, ``job_runs`` row, fenced finish). Each writes one ``round-done``
event with its claim times and CPU seconds; ``stop`` ends them. Starting them once keeps
process start-up (a second of CPU each, on a shared machine) out of every round.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

import psycopg

from .. import queue, settings
from ..events import EventLog, NullLog
from ..queries import q

IDLE, ACTIVE = "tenantlab claimer idle", "tenantlab claimer active"


class PlainClaim(queue.Leased):
    """The leased design with the lab's plain ``FOR UPDATE`` claim: the contrast, never production."""

    def claim_query(self, n: int, *, chained: bool = False) -> tuple[str, dict[str, Any]]:
        return q("claim_plain"), {"lease": self.lease, "batch": n, "kinds": self.kinds()}


def drain(conn: psycopg.Connection, design: queue.Leased, name: str) -> dict[str, Any]:
    """Claim and run jobs until the queue is empty; return the claim times and the span."""
    quiet = NullLog(name)
    claim_ms: list[float] = []
    first = last = time.time()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    while True:
        t0 = time.perf_counter()
        claims = design.claim_many(conn, 1, worker=name, events=quiet)
        claim_ms.append(round((time.perf_counter() - t0) * 1000, 3))
        if not claims:
            break
        design.execute(conn, claims[0])
        last = time.time()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"jobs": len(claim_ms) - 1, "first": first, "last": last,
            "claim_ms": claim_ms[:-1], "empty_claim_ms": claim_ms[-1],
            "cpu_s": round(after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime, 3)}


def main(index: int, path: str) -> int:
    name = f"claimer-{index + 1}"
    log = EventLog(name, path)
    designs = {"skip": queue.Leased(backoff=0), "plain": PlainClaim(backoff=0)}
    with psycopg.connect(settings.dsn() or "", autocommit=True,
                         application_name=IDLE) as conn:
        conn.execute(q("claimers_listen"))
        log.emit("idle")
        while True:
            # The generator ends before the round runs: a connection iterating notifies()
            # cannot run statements meanwhile.
            notes = list(conn.notifies(timeout=1.0, stop_after=1))
            words = notes[0].payload.split() if notes else ["wait"]
            if words[0] == "stop":
                break
            if words[0] != "go" or index >= int(words[2]):
                continue
            _, round_, _workers, claim = words
            # Only the sessions working this round are sampled (by application_name).
            conn.execute(q("claimer_name"), {"name": ACTIVE})
            got = drain(conn, designs[claim], name)
            conn.execute(q("claimer_name"), {"name": IDLE})
            log.emit("round-done", round=int(round_), claim=claim, **got)
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2]))
