"""awa (``awa-pg``, the Python SDK of awa's Rust core) as a row of the matrix: its defaults (★),
and what its docs recommend for reliability (a per-job ``max_attempts`` budget, a per-queue
``deadline_duration`` bounding one attempt, and heartbeat timings for a crash-detection target,
as its configuration guide's "Reliability timings: heartbeat, deadline, rescue").

One job kind, ``tenantlab_body``, on the queue ``tenantlab``; the args carry the body's kind,
tenant and payload. The body sees awa's ``job.attempt`` (1 on the first execution: awa counts
the attempt when it claims the job). awa has no per-job connection hook (a handler gets the job,
no connection): no tenant-leak scenario. Its dead-letter queue is switched on in the Rust
builder only (``dlq_enabled_by_default``, default off); the Python SDK's ``start()`` has no
such option, so terminal failures stay ``failed`` rows here, and a DLQ row would read ``dead``.

Crash rescue, deadline rescue and retry promotion run on the maintenance leader, which one of
the worker processes becomes: awa needs no maintenance process of its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..adapter import Options, State
from ._peers import Peer, install_hint, parse, tagged, url

KIND = "tenantlab_body"
QUEUE = "tenantlab"
DOCS = "https://github.com/hardbyte/awa/blob/main/docs"
STATES: dict[str, State] = {"scheduled": "queued", "available": "queued", "retryable": "queued",
                            "running": "running", "waiting_external": "running",
                            "completed": "done", "failed": "failed", "cancelled": "failed"}


@dataclass
class Body:
    """A job's args: which body to run, for which tenant, with what payload."""

    kind: str
    tenant: int
    payload: dict[str, Any]


class Awa(Peer):
    """awa, through its own Client (migrate, insert) and AsyncClient worker runtime."""

    def install(self, dsn: str) -> None:
        import awa

        with awa.Client(url(dsn, "suite awa install"), max_connections=1) as client:
            client.migrate()

    def enqueue(self, dsn: str, kind: str, tenant: int, payload: dict[str, Any],
                options: Options) -> str:
        import awa

        budget: dict[str, Any] = ({"max_attempts": options.max_attempts}
                                  if self.setting == "recommended" else {})
        with awa.Client(url(dsn, "suite awa enqueue"), max_connections=1) as client:
            job = client.insert(Body(kind, tenant, payload), kind=KIND, queue=QUEUE, **budget)
        return str(job.id)

    def states(self, dsn: str) -> dict[str, State]:
        import psycopg

        with psycopg.connect(tagged(dsn, "suite awa states")) as conn:
            rows = conn.execute("select id, state::text from awa.jobs").fetchall()
            dead = conn.execute("select job_id from awa.dlq_entries").fetchall()
        out: dict[str, State] = {str(i): STATES.get(s, "running") for i, s in rows}
        out.update({str(i): "dead" for (i,) in dead})
        return out


def timings(setting: str, lease: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The queue's config and the runtime's timings: defaults, or scaled to the lease as the
    guide's recipe (detection ≈ staleness + rescue interval; staleness ≥ 3 × interval)."""
    ms = max(int(lease * 1000), 4)
    if setting != "recommended":
        return {}, {}
    return ({"deadline_duration_ms": ms},
            {"heartbeat_interval_ms": ms // 4, "heartbeat_staleness_ms": 3 * ms // 4,
             "heartbeat_rescue_interval_ms": ms // 4, "deadline_rescue_interval_ms": ms // 4})


async def worker(args: Any) -> None:
    """Run one awa worker runtime that executes the suite's bodies, until killed."""
    import awa

    from .. import bodies

    client = awa.AsyncClient(url(args.dsn, "check awa worker"))

    @client.task(Body, kind=KIND, queue=QUEUE)
    async def body(job: Any) -> None:
        a = job.args
        await bodies.run_async(args.history, a.kind, job.id, attempt=job.attempt,
                               tenant=a.tenant, payload=a.payload)

    queue, runtime = timings(args.setting, args.lease)
    await client.start([{"name": QUEUE, "max_workers": args.concurrency, **queue}], **runtime)
    await asyncio.Event().wait()


def rows() -> list[Peer]:
    hint = install_hint("awa-pg==0.6.*")
    promises = ("A job whose worker vanishes is rescued when its heartbeat goes stale, an attempt "
                "past its queue's deadline is force-closed, and a failing job is retried with "
                "backoff until max_attempts (25), then fails (or goes to the DLQ).")
    config = f"{DOCS}/configuration.md"
    links = {"max_attempts": f"{config}#what-can-be-tuned-per-queue-vs-per-job",
             "deadline_duration": f"{config}#deadline--bounding-a-single-attempt",
             "heartbeat": f"{config}#heartbeat--detecting-crashed-workers",
             "dlq": f"{DOCS}/dead-letter-queue.md",
             "max_workers": f"{DOCS}/getting-started-python.md"}
    return [
        Awa(name="awa", setting="default", distribution="awa-pg",
            settings={"max_attempts": 25, "deadline_duration": "5 min",
                      "heartbeat": "interval 30 s, staleness 90 s, rescue scan 30 s",
                      "dlq": "off", "max_workers": "concurrency (no default)"},
            links=links, promises=promises, install_hint=hint),
        Awa(name="awa", setting="recommended", distribution="awa-pg",
            settings={"max_attempts": "max_attempts", "deadline_duration": "lease",
                      "heartbeat": "interval lease/4, staleness 3/4 lease, rescue scan lease/4 "
                                   "(deadline scan lease/4)",
                      "dlq": "off (not settable from the Python SDK)",
                      "max_workers": "concurrency (no default)"},
            links=links, promises=promises, install_hint=hint),
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.role != "worker":
        raise SystemExit("awa has no maintenance process: its workers elect a leader for it")
    asyncio.run(worker(args))


if __name__ == "__main__":
    main()
