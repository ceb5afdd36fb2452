"""awa (``awa-pg``, the Python SDK of awa's Rust core) as rows of the matrix: ★ its true
defaults (max_attempts 25, deadline 5 min, heartbeat every 30 s, stale after 90 s, rescue scan
every 30 s), ``scaled`` the same with its heartbeat staleness at the scenario's lease (the
interval and the rescue scan a quarter of it, as its 3x rule asks), and ``recommended`` what its
configuration guide recommends, quoted in ``QUOTES``: a per-job ``max_attempts`` budget, the
guide's "5-second crash detection target" timings, and the default deadline (above the job).

Its queue storage is finalized before anything is queued, as in every deployment (its
quickstart: "Start processing before the first enqueue so a fresh 0.6 database can
auto-finalize to the queue-storage engine"): ``install`` migrates, starts a runtime once and
stops it. States are read through its client (``Client.list_jobs``), not its tables.

One job kind, ``tenantlab_body``, on the queue ``tenantlab``; the args carry the body's kind,
tenant and payload. Blocking work goes through ``asyncio.to_thread`` (the ``block`` body); the
``block-loop`` scenario calls it on the loop, against the docs. The body sees awa's
``job.attempt`` (1 on the first execution: awa counts the attempt when it claims the job). awa
has no per-job connection hook: no tenant-leak scenario; its 0.6 docs do not claim PgBouncer
support (transaction pooling is on its 0.7 roadmap): the pgbouncer scenario is n/a. Its
dead-letter queue is switched on in the Rust builder only; the Python SDK's ``start()`` has no
such option, so terminal failures stay ``failed``.

Crash rescue, deadline rescue and retry promotion run on the maintenance leader, which one of
the worker processes becomes: awa needs no maintenance process of its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..adapter import Options, Policy, State
from ._peers import Peer, install_hint, parse, quoted, run, three_rows, url

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
        """Migrate, then finalize its queue storage before the first enqueue: start a runtime
        once (a fresh 0.6 database auto-finalizes when one starts) and stop it."""
        import awa

        async def go() -> None:
            client = awa.AsyncClient(url(dsn, "suite awa install"))
            await client.migrate()

            @client.task(Body, kind=KIND, queue=QUEUE)
            async def nothing(job: Any) -> None:
                return None

            await client.start([{"name": QUEUE, "max_workers": 1}])
            try:
                status = ""
                for _ in range(100):
                    status = await client.storage_status()
                    if '"finalized_at": null' not in status:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise RuntimeError(f"awa's queue storage was not finalized: {status[:200]}")
            finally:
                await client.shutdown()
        run(go)

    def enqueue(self, dsn: str, kind: str, tenant: int, payload: dict[str, Any],
                options: Options) -> str:
        import awa

        budget: dict[str, Any] = ({"max_attempts": options.max_attempts}
                                  if self.setting == "recommended" else {})
        with awa.Client(url(dsn, "suite awa enqueue"), max_connections=1) as client:
            job = client.insert(Body(kind, tenant, payload), kind=KIND, queue=QUEUE, **budget)
        _INSERTED.setdefault(dsn, set()).add(str(job.id))
        _CREATED.setdefault(dsn, {})[str(job.id)] = _epoch(job.created_at)
        return str(job.id)

    def states(self, dsn: str) -> dict[str, State]:
        """Every job's state, through its client's ``get_job``, for each job the suite
        inserted. On its queue storage a completed job leaves nothing the API reads
        (``get_job`` raises "job not found"; ``list_jobs`` lists neither running nor completed
        jobs): a job it inserted that ``get_job`` no longer finds is done. Final states are
        kept, so a look asks only about the others."""
        import awa

        known = _FINAL.setdefault(dsn, {})
        out: dict[str, State] = dict(known)
        with awa.Client(url(dsn, "suite awa states"), max_connections=1) as client:
            for job in sorted(_INSERTED.get(dsn, set()) - set(known)):
                try:
                    state = client.get_job(int(job)).state
                except awa.AwaError as e:
                    if "not found" not in str(e):
                        raise
                    out[job] = known[job] = "done"
                    continue
                name = str(getattr(state, "name", state)).lower().split(".")[-1]
                out[job] = STATES.get(name, "running")
                if out[job] in ("done", "failed", "dead"):
                    known[job] = out[job]
        return out

    def created(self, dsn: str) -> dict[str, float]:
        """Each job's insert on the server's clock: the ``created_at`` its insert returned."""
        return dict(_CREATED.get(dsn, {}))

    def policy(self, options: Options) -> Policy:
        """max_attempts executions; a failure retried after 2^attempt s (+ up to 25 %, capped at
        24 h), promoted within a second; a crashed attempt rescued once its heartbeat is stale
        (staleness + a rescue scan), then the same backoff, as its docs promise."""
        cfg = timing_values(self.setting, options.lease)
        n = options.max_attempts if self.setting == "recommended" else DEFAULT_ATTEMPTS
        backoff = sum(min(2.0 ** a * 1.125, 86_400.0) + 1.0 for a in range(1, n))
        detect = (cfg["heartbeat_staleness_ms"] + cfg["heartbeat_rescue_interval_ms"]) / 1000
        return Policy(budget=n, timeout=cfg["heartbeat_staleness_ms"] / 1000,
                      poison_final=backoff, crash_final=n * detect + backoff, poll=0.2,
                      basis=f"max_attempts {n}, backoff 2^attempt s capped at 24 h, heartbeat "
                            f"stale after {cfg['heartbeat_staleness_ms'] / 1000:g} s, rescue scan "
                            f"every {cfg['heartbeat_rescue_interval_ms'] / 1000:g} s")


DEFAULT_ATTEMPTS = 25
#: The ids the suite inserted, by database (a completed job leaves awa's listings).
_INSERTED: dict[str, set[str]] = {}
_CREATED: dict[str, dict[str, float]] = {}
_FINAL: dict[str, dict[str, State]] = {}


def _epoch(stamp: Any) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(stamp)).timestamp()
#: Its runtime's defaults (ms), and the configuration guide's 5-second detection target.
DEFAULTS = {"heartbeat_interval_ms": 30_000, "heartbeat_staleness_ms": 90_000,
            "heartbeat_rescue_interval_ms": 30_000}
RECOMMENDED = {"heartbeat_interval_ms": 1_000, "heartbeat_staleness_ms": 4_000,
               "heartbeat_rescue_interval_ms": 1_000}


def timing_values(setting: str, lease: float) -> dict[str, int]:
    """The heartbeat timings of a row (ms): defaults, scaled, or the guide's recipe."""
    if setting == "scaled":
        ms = max(int(lease * 1000), 4)
        return {"heartbeat_interval_ms": ms // 4, "heartbeat_staleness_ms": ms,
                "heartbeat_rescue_interval_ms": ms // 4}
    if setting == "recommended":
        return dict(RECOMMENDED)
    return dict(DEFAULTS)


def timings(setting: str, lease: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The queue's config and the runtime's timings to pass: none for ★ (its defaults); the
    deadline stays at its default (5 min, above every job of the suite) in every row."""
    if setting == "default":
        return {}, {}
    return {}, timing_values(setting, lease)


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


QUOTES = {
    "max_attempts": ("configuration.md#what-can-be-tuned-per-queue-vs-per-job",
                     "Per job enqueue | queue, priority, max_attempts, run_at, tags, metadata, "
                     "unique | Stored with the job. Use this for routing, priority, retry "
                     "budget, scheduling, identity, and operator context."),
    "heartbeat": ("configuration.md#heartbeat--detecting-crashed-workers",
                  "For a 5-second crash detection target: heartbeat_interval=1s, "
                  "heartbeat_staleness=4s, heartbeat_rescue_interval=1s."),
    "deadline_duration": ("configuration.md#deadline--bounding-a-single-attempt",
                          "Hard upper bound on a single attempt."),
    "storage": ("../awa-python/examples/quickstart.py",
                "Start processing before the first enqueue so a fresh 0.6 database can "
                "auto-finalize to the queue-storage engine."),
}


def rows() -> list[Peer]:
    hint = install_hint("awa-pg==0.6.*")
    promises = ("A job whose worker vanishes is rescued when its heartbeat goes stale, an attempt "
                "past its queue's deadline is force-closed, and a failing job is retried with "
                "backoff until max_attempts (25), then fails (or goes to the DLQ).")
    links = {"max_attempts": f"{DOCS}/configuration.md#what-can-be-tuned-per-queue-vs-per-job",
             "deadline_duration": f"{DOCS}/configuration.md#deadline--bounding-a-single-attempt",
             "heartbeat": f"{DOCS}/configuration.md#heartbeat--detecting-crashed-workers",
             "dlq": f"{DOCS}/dead-letter-queue.md",
             "max_workers": f"{DOCS}/getting-started-python.md",
             "storage": "https://github.com/hardbyte/awa/blob/main/awa-python/examples/"
                        "quickstart.py",
             "blocking work": "https://docs.python.org/3/library/asyncio-task.html"
                              "#running-in-threads"}
    base = {"max_attempts": 25, "deadline_duration": "5 min",
            "heartbeat": "interval 30 s, staleness 90 s, rescue scan 30 s",
            "dlq": "off", "max_workers": "concurrency (no default)",
            "storage": "queue storage, finalized before the first enqueue",
            "blocking work": "asyncio.to_thread"}
    scaled = {**base, "heartbeat": "interval lease/4, staleness the scenario's lease (2 s), "
                                   "rescue scan lease/4"}

    def source(key: str, value: Any) -> dict[str, Any]:
        where, quote = QUOTES[key]
        link = (f"{DOCS}/{where}" if not where.startswith("..")
                else "https://github.com/hardbyte/awa/blob/main/" + where[3:])
        return quoted(value, link, quote)

    recommended: dict[str, Any] = {
        **base, "max_attempts": source("max_attempts", "max_attempts (3), per job"),
        "heartbeat": source("heartbeat", "interval 1 s, staleness 4 s, rescue scan 1 s"),
        "deadline_duration": source("deadline_duration", "5 min (default; above every job)"),
        "storage": source("storage", "queue storage, finalized before the first enqueue")}
    return [Awa(name="awa", setting=setting, distribution="awa-pg", settings=settings,
                links=links, promises=promises, install_hint=hint)
            for setting, settings in three_rows(base, scaled, recommended)]


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.role != "worker":
        raise SystemExit("awa has no maintenance process: its workers elect a leader for it")
    asyncio.run(worker(args))


if __name__ == "__main__":
    main()
