"""The ceiling: the worker's own claim and finish statements with no Python between them.

``tenantlab bench`` reads every row against it (``ceiling``, ``<row>_vs_ceiling``). pgbench
(from the server's own bin directory, or PATH) runs, on one connection as the worker role, the
very statements of ``jobqueue``'s ``sql/queries.sql``, their parameters bound (``-M prepared``,
as psycopg prepares a statement run often), one transaction after another:

- ``one`` (the ``leased`` loop's transaction): ``begin``; ``start_if_owner`` (the fence, the
  tenant set locally); ``complete_if_owner_and_claim`` (the fenced finish and the next claim);
  ``commit``. One job per transaction, the next job's id carried by ``\\gset``.
- ``batch`` (``run_together``'s transaction, ``--batch 10 --batch-commit``): ``begin``;
  ``lock_batch_if_owner`` (every claim's fence, checked and held by a row lock); nothing per
  job (the worker sends a job's savepoint and tenant, ``start_in_batch``, only before the first
  statement of its handler, and the bench's no-op sends none); ``complete_batch_if_owner`` (the
  fenced finish of all ten, their job_runs rows) and the claim of the next ten
  (``claim_leased``, its ids gathered into arrays for the next transaction); ``commit``.

What is left out is only the client: the handler call, psycopg, the round trips the worker
pipelines. Jobs per second = pgbench's transactions per second times the jobs in each.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from jobqueue.queries import q as jq

from . import db, kinds, queue
from .queries import q

BATCH = 10
_PARAM = re.compile(r"%\((\w+)\)s")
_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)


def pgbench() -> Path | None:
    """Return the pgbench next to the embedded server's binaries, else on PATH; None: none."""
    try:
        from .server import bindir

        path = bindir() / "pgbench"
        if path.exists():
            return path
    except Exception:  # noqa: BLE001 - an external server: look on PATH
        pass
    found = shutil.which("pgbench")
    return Path(found) if found else None


def statement(name: str, **bound: str) -> str:
    """Return the worker's query `name` for pgbench: each ``%(p)s`` as ``:p``, or as `bound[p]`."""
    text = jq(name).replace("%%", "%").rstrip().rstrip(";")
    return _PARAM.sub(lambda m: bound.get(m.group(1), ":" + m.group(1)), text)


def script(batch: int) -> str:
    """Return the pgbench script of one transaction: `batch` jobs finished, the next claimed."""
    if batch == 1:
        return "\n".join([
            "begin;",
            statement("start_if_owner", tenant=":tenant_id") + " \\gset",
            statement("complete_if_owner_and_claim", batch="1") + " \\gset",
            "commit;", ""])
    # The worker's batch for the bench's no-op job: BEGIN with the lock of every fence, nothing
    # per job (a handler that sends no statement gets no savepoint and no tenant: there is
    # nothing for them to cover), the fenced finish of all, the next claim, COMMIT.
    empty = f"array_fill(null::timestamptz, array[{batch}])"
    lines = ["begin;", statement("lock_batch_if_owner") + ";",
             statement("complete_batch_if_owner", started=empty, finished=empty) + ";",
             "with claimed as (" + statement("claim_leased", batch=str(batch)) + ")\n"
             "select array_agg(id order by id) as ids, array_agg(attempt order by id) as attempts,"
             " array_agg(tenant_id::text order by id) as tenants from claimed \\gset",
             "commit;", ""]
    return "\n".join(lines)


def _env(dsn: str) -> dict[str, str]:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    env = dict(os.environ)
    for key, var in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER"),
                     ("password", "PGPASSWORD"), ("dbname", "PGDATABASE")):
        if info.get(key) is not None:
            env[var] = str(info[key])
    env["PGAPPNAME"] = "bench ceiling"
    return env


def _array(values: list[Any]) -> str:
    return "{" + ",".join(str(v) for v in values) + "}"


def run(s: db.Scratch, jobs: int, batch: int, binary: Path) -> float:
    """Drain about `jobs` no-op jobs with pgbench, `batch` per transaction; return jobs/s."""
    transactions = max(1, jobs // batch)
    with s.connect("admin", "bench reset", autocommit=True) as admin:
        admin.execute(q("reset_queue"))
    handled = sorted(kinds.handlers)
    params = {"lease": 30.0, "batch": batch, "kinds": handled, "queues": ["default"]}
    with s.connect("worker", "bench ceiling", autocommit=True) as conn:
        # Jobs for every transaction, and for the last one's claim of the next.
        queue.enqueue(conn, "noop", count=(transactions + 1) * batch)
        first = conn.execute(jq("claim_leased"), params).fetchall()
    first.sort()
    variables = {"lease": "30", "worker": "bench-ceiling", "setting": "app.tenant",
                 "kinds": _array(handled), "queues": "{default}"}
    if batch == 1:
        variables |= {"id": str(first[0][0]), "attempt": str(first[0][2]),
                      "tenant_id": str(first[0][1])}
    else:
        variables |= {"ids": _array([r[0] for r in first]),
                      "attempts": _array([r[2] for r in first]),
                      "tenants": _array([r[1] for r in first])}
    with tempfile.TemporaryDirectory(prefix="tenantlab-ceiling-") as tmp:
        path = Path(tmp) / f"ceiling_{batch}.sql"
        path.write_text(script(batch))
        argv = [str(binary), "-n", "-c", "1", "-M", "prepared", "-t", str(transactions),
                "-f", str(path), *(a for k, v in variables.items() for a in ("-D", f"{k}={v}"))]
        out = subprocess.run(argv, env=_env(s.worker), capture_output=True, text=True,
                             timeout=600, check=False)
    m = _TPS.search(out.stdout)
    if out.returncode != 0 or not m:
        raise RuntimeError(f"bench ceiling: pgbench failed ({out.returncode}): "
                           f"{(out.stderr or out.stdout)[-800:]}")
    with s.connect("worker", "bench ceiling count", autocommit=True) as conn:
        counts: dict[str, int] = dict(conn.execute(jq("job_counts")).fetchall())
    done = counts.get("done", 0)
    if done != transactions * batch:
        raise RuntimeError(f"bench ceiling: {done} jobs done, not {transactions * batch}: a "
                           "finish was fenced out")
    return float(m.group(1)) * batch
