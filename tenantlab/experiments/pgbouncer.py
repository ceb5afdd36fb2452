"""Finding ``pgbouncer`` (beyond the article): transaction pooling shares sessions across processes.

A real PgBouncer in transaction mode (tenantlab/pgbouncer.py) sits in front of a scratch
database; worker processes are its clients. Process A's jobs set their tenant, process B's
transactions set none and record what their server connection carries. In the session form B
reads under A's tenant; in the local form never. Then what else of the session stops meaning
what it meant: psycopg's automatic prepared statements, a session advisory lock, LISTEN. Last,
the corrected worker (``queue.Leased``, ``prepare_threshold=None``) through the pooler and
direct, with its jobs/s. Each part gets a pooler and a database of its own, so no part meets
server connections that another part left a tenant or a lock on. The probes live in
``_probes.py``, the worker processes in ``_pooled.py``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from .. import db, events, finding, queue
from .. import pgbouncer as pooler
from ..finding import Result, Verdict, check, knob, plain
from ..queries import q
from ._pooled import clients, wait
from ._probes import advisory_lock, listen, pooler_facts, prepared_probes

CLAIM = ("Behind PgBouncer in transaction mode one server connection serves every process in "
         "turn: a tenant set in the session form by one worker process is read by another "
         "process's transactions, and psycopg's automatic prepared statements, session advisory "
         "locks and LISTEN stop working; the local form leaks nothing and the corrected worker "
         "runs every job through it.")

ARTICLE: dict[str, Any] = {
    "note": "not in the article: measured here, beyond it, through a real PgBouncer",
}


@dataclass(frozen=True)
class Knobs(finding.Knobs):
    """Pool size, worker processes, B's reads, and the corrected worker's jobs."""

    ARTICLE_SETUP: ClassVar[bool] = False  # the article never ran this: judged on expectations

    pool_size: int = knob(2, at_least=1, lo=1, hi=6, label="server connections (pool size)")
    processes: int = knob(2, at_least=2, lo=2, hi=5, label="worker processes")
    reads: int = knob(100, full=400, at_least=1, lo=20, hi=400, step=20, label="reads by process B")
    jobs: int = knob(300, full=2000, at_least=1, lo=50, hi=2000, step=50, label="jobs (corrected worker)")


# --- part 1: the tenant context across processes -------------------------------------------

def _tenants_of(i: int, writers: int) -> list[int]:
    # Disjoint tenants per process: a tenant B sees names the process that set it.
    return [t for t in range(1, 101) if (t - 1) % writers == i][:12]


def leak(s: db.Scratch, form: str, k: Knobs, workdir: Path,
         live: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Run tenant processes and one reader through a fresh pooler; return their events."""
    path = workdir / f"{form}.jsonl"
    writers = k.processes - 1
    names = [chr(ord("A") + i) for i in range(writers)]
    reader = chr(ord("A") + writers)
    with pooler.running(s.admin, pooler.Config(pool_size=k.pool_size)) as b, \
            clients(b.through(s.worker), path) as c:
        for i, name in enumerate(names):
            c.start("tenant", name, "--form", form,
                    "--tenants", ",".join(map(str, _tenants_of(i, writers))), "--interval", "0.004")

        def jobs_started() -> bool:
            done = {e["worker"] for e in events.read(path) if e["event"] == "job"}
            return done >= set(names)

        # B starts once every A has run a job: its reads then all meet a pool that A has used.
        wait(jobs_started, 30, procs=c.procs)
        proc = c.start("reader", reader, "--reads", str(k.reads), "--interval", "0.008")
        tick = (lambda: live(events.read(path))) if live else None
        wait(lambda: proc.poll() is not None, 60 + k.reads * 0.1, tick, procs=c.procs)
    out = events.read(path)
    for e in out:
        e["form"] = form
        e["role"] = "reader" if e["worker"] == reader else "tenant"
    return out


def reads_frame(evs: list[dict[str, Any]]) -> pd.DataFrame:
    """Return B's reads: form, read number, the tenant it ran under, wrong so far."""
    rows = [{"form": e.get("form", ""), "read": e["n"], "tenant": e["tenant"],
             "invoices": e["invoices"], "wrong": e["tenant"] is not None}
            for e in evs if e["event"] == "read"]
    df = pd.DataFrame(rows, columns=["form", "read", "tenant", "invoices", "wrong"])
    df["wrong_so_far"] = df.groupby("form")["wrong"].cumsum().astype(int) if len(df) else []
    return df


def _leak_summary(evs: list[dict[str, Any]]) -> dict[str, Any]:
    reads = [e for e in evs if e["event"] == "read"]
    owner = {e["tenant"]: e["worker"] for e in evs if e["event"] == "job"}
    wrong = [e for e in reads if e["tenant"] is not None]
    return {
        "reads": len(reads),
        "wrong_tenant_reads": len(wrong),
        "from_other_process": sum(1 for e in wrong if owner.get(e["tenant"]) not in (None, "")),
        "tenant_jobs": sum(1 for e in evs if e["event"] == "job"),
        "server_connections": len({e["server"] for e in evs if "server" in e}),
    }


def script(res: Result, form: str = "session", steps: int = 14) -> pd.DataFrame:
    """Return who got which server connection: the first steps of one form, in time order."""
    evs = [e for e in res.data.get("events", []) if e.get("form") == form
           and e["event"] in ("job", "read")]
    if not evs:
        return pd.DataFrame(columns=["t (ms)", "who", "server connection", "does", "sees"])
    evs.sort(key=lambda e: e["t"])
    servers: dict[int, int] = {}
    # Start just before B's first read: A's last jobs before it, then both interleaved.
    first_read = next((i for i, e in enumerate(evs) if e["event"] == "read"), 0)
    shown = evs[max(0, first_read - 3):][:steps]
    t0 = shown[0]["t"]
    rows = []
    for e in shown:
        server = servers.setdefault(e["server"], len(servers) + 1)
        if e["event"] == "job":
            does = f"job: sets tenant {e['tenant']} ({form} form)"
            sees = f"tenant {e['tenant']}: {e['invoices']:,} invoices"
        else:
            does = "reads, sets no tenant"  # the transaction B runs every time
            sees = ("no tenant: 0 invoices" if e["tenant"] is None
                    else f"tenant {e['tenant']}: {e['invoices']:,} invoices  ✗")
        rows.append({"t (ms)": round((e["t"] - t0) * 1000), "who": f"process {e['worker']}",
                     "server connection": f"server {server} (pid {e['server']})",
                     "does": does, "sees": sees})
    return pd.DataFrame(rows)


def sessions(res: Result) -> pd.DataFrame:
    """Return one row per session feature: what happened through the pooler, and the fix."""
    m = res.measured
    cols = ["session feature", "through PgBouncer (transaction mode)", "instead"]
    if m.get("skipped"):
        return pd.DataFrame([{"session feature": "all", cols[1]: f"skipped: {m['skipped']}",
                              "instead": ""}], columns=cols)
    ps, lock = m["prepared_statements"], m["advisory_lock"]
    rows = [
        ("set_config(..., false): the session form",
         f"{m['session_form']['wrong_tenant_reads']} of {m['session_form']['reads']} of B's reads "
         "ran under A's tenant", "set_config(..., true) inside the job's transaction"),
        ("psycopg's automatic prepared statements",
         f"{prepared_failures(ps)}: {ps['default_error']}"
         if ps["default_failed_at"] else "no job failed",
         f"{' or '.join(ps['fixed_by']) or 'nothing measured fixed it'}; "
         f"max_prepared_statements: {ps['max_prepared_statements']}"),
        ("session advisory lock (pg_advisory_lock)",
         "B's next transaction got the lock A holds: same server connection"
         if lock["crossed"] else "B did not get A's lock",
         "pg_advisory_xact_lock, or a lease column in the jobs table"),
        ("LISTEN",
         "no notification" if not m["listen_through_pooler_works"] else "the notification arrived",
         "LISTEN on a direct connection (it got the notification)"
         if m["listen_direct_works"] else "a direct connection (it got nothing either)"),
    ]
    return pd.DataFrame(rows, columns=cols)


# --- part 3: the corrected worker through the pooler ----------------------------------------

def corrected(s: db.Scratch, dsn: str, k: Knobs, workdir: Path, how: str) -> dict[str, Any]:
    """Run `processes` corrected workers over `jobs` count jobs; return done, leaks and jobs/s."""
    with db.connect(s.admin, "pgbouncer reset", autocommit=True) as admin:
        admin.execute(q("reset_queue"))
    with db.connect(s.worker, "pgbouncer enqueue", autocommit=True) as conn:
        queue.enqueue(conn, "count", count=k.jobs)
    path = workdir / f"corrected-{how}.jsonl"
    with clients(dsn, path) as c:
        procs = [c.start("leased", f"{how}-{i + 1}") for i in range(k.processes)]
        wait(lambda: all(p.poll() is not None for p in procs), 60 + k.jobs * 0.05, procs=procs)
    with db.connect(s.worker, "pgbouncer states", autocommit=True) as conn:
        states = queue.job_states(conn)
    evs = events.read(path)
    tenants = {e["job"]: e["tenant"] for e in evs if e["event"] == "claim"}
    finishes = [e for e in evs if e["event"] == "finish"]
    # A job that counted another tenant's invoices (or none) ran under the wrong context.
    wrong = sum(1 for e in finishes if e["result"] != 20000 // tenants[e["job"]])
    claims = [e["t"] for e in evs if e["event"] == "claim"]
    span = max(e["t"] for e in finishes) - min(claims) if finishes and claims else 0.0
    return {"jobs": k.jobs, "done": sum(1 for st in states if st["status"] == "done"),
            "wrong_counts": wrong, "jobs_per_s": round(len(finishes) / span, 1) if span else 0.0}


# --- the run ---------------------------------------------------------------------------------

def run(knobs: Knobs | None = None, *, live: Any = None, progress: Any = None) -> Result:
    """Measure every part through a real PgBouncer; skip (never fake) when it is not installed."""
    k = knobs or Knobs.sized()
    if not pooler.installed():
        skipped: dict[str, Any] = {"pgbouncer_version": None, "skipped": pooler.INSTALL}
        return Result("pgbouncer", k, skipped, judge(skipped, k),
                      table=pd.DataFrame(columns=["form"]))
    step = progress or (lambda n=1: None)
    evs: list[dict[str, Any]] = []
    facts = pooler_facts(k.pool_size)
    with tempfile.TemporaryDirectory(prefix="tenantlab-") as tmp:
        workdir = Path(tmp)

        def drawer(form: str) -> Callable[[list[dict[str, Any]]], None]:
            def draw(now: list[dict[str, Any]]) -> None:
                if live is not None:
                    live.update(reads_frame(evs + [{**e, "form": form} for e in now]))
            return draw

        # A database of its own per part: a pooler keeps one pool per database, so no part meets
        # server connections an earlier part left a tenant or a lock on (also on an external one).
        forms = {}
        for form in ("session", "local"):
            draw = drawer(form)
            with db.scratch(f"pgbouncer {form}") as s:
                part = leak(s, form, k, workdir, live=draw)
            evs += part
            forms[form] = _leak_summary(part)
            draw([])  # the finished form, with its final reads
            step(1)
        with db.scratch("pgbouncer prepared") as s:
            prepared = prepared_probes(s, facts)
        step(1)
        with db.scratch("pgbouncer sessions") as s:
            lock = advisory_lock(s)
            heard = listen(s)
        step(1)
        with db.scratch("pgbouncer corrected") as s:
            with pooler.running(s.admin, pooler.Config(pool_size=k.pool_size)) as b:
                through = corrected(s, b.through(s.worker), k, workdir, "pgbouncer")
            direct = corrected(s, s.worker, k, workdir, "direct")
        step(1)
    measured = {
        "pgbouncer_version": facts["version"],
        "pooler": facts["pooler"],
        "pool_mode": facts["pool_mode"],
        "pool_size": facts["pool_size"],
        "processes": k.processes,
        "session_form": forms["session"],
        "local_form": forms["local"],
        "prepared_statements": prepared,
        "advisory_lock_crossed": lock["crossed"],
        "advisory_lock": lock,
        "listen_through_pooler_works": heard["through_pooler"],
        "listen_direct_works": heard["direct"],
        "worker_jobs_per_s": {"direct": direct["jobs_per_s"], "pgbouncer": through["jobs_per_s"]},
        "corrected_worker": {"direct": direct, "pgbouncer": through},
    }
    measured = plain(measured)
    table = pd.DataFrame([{"form": f"{form} form", **forms[form]} for form in forms])
    return Result("pgbouncer", k, measured, judge(measured, k),
                  table=table, data={"events": evs, "reads": reads_frame(evs)})


def judge(measured: dict[str, Any], knobs: Knobs | None = None) -> Verdict:
    """Judge the leak, the session features and the corrected worker through the pooler."""
    if measured.get("skipped"):
        return Verdict.of([check(f"skipped: {measured['skipped']}", False,
                                 "a real PgBouncer", "none installed: nothing measured")],
                          article=False)
    sf, lf = measured["session_form"], measured["local_form"]
    ps = measured["prepared_statements"]
    lock = measured.get("advisory_lock", {})
    cw = measured["corrected_worker"]["pgbouncer"]
    rate = measured["worker_jobs_per_s"]
    checks = [
        check("session form: B reads under A's tenant", sf["wrong_tenant_reads"] > 0,
              f"some of B's {sf['reads']} reads", f"{sf['wrong_tenant_reads']} of {sf['reads']} reads"),
        check("local form: B never reads under a tenant", lf["wrong_tenant_reads"] == 0,
              f"0 of {lf['reads']} reads", f"{lf['wrong_tenant_reads']} of {lf['reads']} reads"),
        check("psycopg's automatic prepared statements",
              (ps["default_failed_at"] is None) == bool(ps.get("pooler_tracks_prepared")),
              "every job runs (the pooler tracks them)" if ps.get("pooler_tracks_prepared")
              else f"jobs fail through the pooler (two clients taking turns, "
              f"{ps.get('default_jobs', 'their')} jobs)",
              f"{prepared_failures(ps)}: {ps['default_error']}"
              if ps["default_failed_at"] else "no job failed"),
        check("prepare_threshold=None", "prepare_threshold=None" in ps["fixed_by"],
              "every job runs", "every job ran" if "prepare_threshold=None" in ps["fixed_by"]
              else "a job still failed"),
        check("session advisory lock", measured["advisory_lock_crossed"],
              "B's transaction takes the lock A holds (same server connection)",
              "B got it while A held it" if measured["advisory_lock_crossed"]
              else f"B got it: {lock.get('b_same_server_got_lock')}"),
        check("LISTEN through the pooler", not measured["listen_through_pooler_works"]
              and measured.get("listen_direct_works", True),
              "no notification through the pooler; a direct connection gets it",
              f"through the pooler: {'got it' if measured['listen_through_pooler_works'] else 'nothing'}"
              f"; direct: {'got it' if measured.get('listen_direct_works') else 'nothing'}"),
        check("corrected worker through PgBouncer", cw["done"] == cw["jobs"] and cw["wrong_counts"] == 0,
              f"{cw['jobs']} of {cw['jobs']} done, none under another tenant",
              f"{cw['done']} of {cw['jobs']} done, {cw['wrong_counts']} under another tenant; "
              f"{rate['pgbouncer']:g} jobs/s (direct {rate['direct']:g})"),
    ]
    return Verdict.of(checks, article=False)


def prepared_failures(ps: dict[str, Any]) -> str:
    """Return how often the prepared statement failed over the probe, and first when."""
    if ps.get("default_failed_at") is None:
        return "no job failed"
    if "default_failed" not in ps:  # a stored run from before every job ran
        return f"failed at job {ps['default_failed_at']}"
    jobs = ", ".join(map(str, ps["default_failed_jobs"]))
    return (f"failed {ps['default_failed']} of {ps['default_jobs']} jobs (jobs {jobs}), "
            f"first at job {ps['default_failed_at']}")
