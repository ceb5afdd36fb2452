"""Write this package into a directory as a standalone package an application can vendor.

``export(DIR, name="jobqueue")`` writes the package to ``DIR/NAME``: the modules, the named
queries and the migrations (package data), renamed where the name differs (its imports are
relative; only docstrings and the command line name it), with a README inside the package:
migrate, grant, register handlers, run workers and the reaper. Nothing in it imports the kit.

It never deletes what it did not write. ``DIR/NAME/.exported-from-tenantlab`` lists the files
an export wrote; a later export removes those and only those. A ``DIR/NAME`` that is not empty
and holds no such list is someone's code: refused, unless ``force`` (then same-named files are
overwritten and nothing is deleted).
"""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = __package__ or "jobqueue"
#: What the package is made of: modules, named queries, migrations (read at run time).
FILES = ("*.py", "sql/*.sql", "migrations/*.sql")
MARKER = ".exported-from-tenantlab"


class ExportRefused(ValueError):
    """The target holds files this export did not write: they are not ours to replace."""


README = """\
# {name}: a PostgreSQL job queue with counted attempts, leases and a fenced finish

Exported from tenantlab ({source}). Needs Python 3.12+, psycopg 3.2+ and PostgreSQL 15+.
This directory is the package: put its parent directory on `PYTHONPATH` (or copy it into your
project). A new export replaces the files listed in `{marker}` and nothing else.

## 1. Install the schema, as the role that will own it

    python -m {name} migrate --dsn "$OWNER_DSN" --tenant-type bigint

`migrate` creates the schema `jobqueue` (tables `jobqueue.jobs`, `jobqueue.job_runs`,
`jobqueue.tenant_turns`, the view `jobqueue.claimable`, and `jobqueue.migrations`, which records
each migration applied) and applies `{name}/migrations/*.sql` in order, once each, under an
advisory lock. Nothing lands in `public`, and an application's own `jobs` table is never touched.
It prints the migrations it applied, or `up to date`. After upgrading the package, run it again
before starting the new workers: a worker refuses a schema behind its code (exit 2).

`--tenant-type` is the type of your tenant ids: `bigint` (the default), `integer`, `uuid` or
`text`, matching your tenants table. The first migration fixes it (the domain
`jobqueue.tenant_id`); changing it later is a migration of your own. `enqueue(tenant=...)` then
takes an `int`, a `str` or a `uuid.UUID`.

## 2. Grant three roles

The role that migrates owns the schema and its tables: the database's owner, or your
application's migration role. It needs `create` on the database (to create the schema), and it
runs every later `migrate`. Neither of the other two roles should be it.

The worker role (workers, the reaper, prune): an ordinary login role, not the owner, not
superuser, no BYPASSRLS, so your row-level security applies to its handlers' writes:

    grant usage on schema jobqueue to app_worker;
    grant select, insert, update, delete on jobqueue.jobs, jobqueue.job_runs to app_worker;
    grant select, update on jobqueue.claimable to app_worker;
    grant select on jobqueue.migrations to app_worker;  -- the version check at start
    grant select, insert, update on jobqueue.tenant_turns to app_worker;  -- --fair round-robin
    grant select, insert, update, delete on jobqueue.workers to app_worker;  -- who runs, what
    grant select, insert, update on jobqueue.periodic to app_worker;  -- periodic jobs
    alter role app_worker set idle_in_transaction_session_timeout = '5min';
    alter role app_worker set statement_timeout = '10min';

The role that enqueues (your application's):

    grant usage on schema jobqueue to app;
    grant insert, select (id, unique_key, status) on jobqueue.jobs to app;  -- returning id; unique keys

`enqueue` also notifies the idle workers (`pg_notify('jobqueue', '')`, sent when the caller's
transaction commits): that needs no grant, `pg_notify` is executable by every role unless you
revoked it from PUBLIC (then `grant execute on function pg_notify(text, text) to app`).

The two timeouts end a worker session that hangs, so its job's lease runs out and another
worker retries it (counted) instead of it waiting forever: `idle_in_transaction_session_timeout`
must be longer than the longest pause a handler takes between two of its statements (the job's
transaction is open while the handler works: an API call, a render), `statement_timeout` longer
than its slowest statement. A statement timeout, lock timeout, deadlock or serialization failure
fails only its job (counted, the error in `jobs.last_error`); only a broken connection is an
outage. An idle worker sits outside any transaction, so neither timeout ends it. Keep
`jobqueue.jobs` out of tenant policies: a worker sees every job before it knows which tenant to
become.

## 3. Register handlers and queue jobs

    # myapp/jobs.py
    from {name} import handlers, enqueue, enqueue_many, Job

    @handlers.register("send_invoice")
    def send_invoice(conn, job):
        # conn: inside the job's transaction, app.tenant already set (locally) to job.tenant_id
        conn.execute("update invoices set sent = now() where id = %s", (job.payload["invoice"],))

    # anywhere in the application, in its own transaction:
    enqueue(conn, "send_invoice", tenant=42, payload={{"invoice": 7}})

A handler's writes commit with the job's finish or not at all; an exception fails the attempt
(counted; retried after a backoff; dead at max_attempts).

A handler that writes holds the database's horizon: from its first write until its finish
commits, its transaction has an id, and VACUUM cannot remove rows that died after it began, in
any table. A handler that only reads (or calls out) holds nothing while it runs. So keep the
writing part short, and do the slow part (an API call, a render) before the first write.

A worker claims only the kinds it has handlers for: a job of a kind no running worker knows
stays queued (not failed, not dead) until a worker that has it starts, so a rolling deploy that
adds a kind loses nothing. A worker without handlers refuses to start (exit 2). To refuse an
unknown kind when queueing instead, pass `known=handlers` (raises `UnknownKind`, naming the
kinds it knows).

Routing (all optional; the defaults are one queue, FIFO):

    enqueue(conn, "report", tenant=42, queue="slow", priority=5, unique_key="report-42",
            run_after=60)                      # seconds, a timedelta or a datetime
    enqueue_many(conn, [Job("send_invoice", 42, {{"invoice": i}}) for i in range(10_000)])
    await enqueue_async(aconn, ...)            # and enqueue_many_async: psycopg.AsyncConnection

- `queue`: a worker serves `--queues default` unless given a list (`--queues slow,default`), so
  a queue is how to keep a slow kind off the workers that serve everything else;
- `priority` (-10..10, default 0): higher first, then the oldest, across the queues a
  worker serves; the fair claims keep it within a tenant;
- `unique_key`: while a job with the key is queued or running, enqueueing it again returns
  that job's id (race-free: a partial unique index decides);
- `enqueue_many`: one statement for thousands of jobs, their ids back in order;
- `python -m {name} enqueue KIND --tenant T [--payload JSON] [--queue Q] [--priority P]
  [--unique-key K] [--run-after S] [--handlers MODULE] [--json]` prints the id.

Periodic jobs, declared in the handlers module; every worker that loads it enqueues each slot
once, whatever their number (the slot is moved forward in `jobqueue.periodic` by the statement
that inserts the job):

    from {name} import schedules
    schedules.add("nightly", "report", tenant=42, cron="0 3 * * *")   # UTC, 5 fields
    schedules.add("sync", "sync", tenant=42, every=300, queue="slow")

A new schedule starts at its next slot; after downtime only the latest missed slot runs.

## 4. Run workers

    JOBQUEUE_DSN=postgresql://app_worker@db/app python -m {name} --handlers myapp.jobs

The heartbeat is on by default: it extends the leases of the jobs a worker holds every third of
the lease, so a job may run longer than `--lease S` (default 30) while its worker lives;
`--heartbeat S` sets the interval (< lease), `--heartbeat 0` turns it off (a job longer than its
lease then runs again), `--max-runtime S` abandons a job after S seconds. Other options:
`--batch N` (claim N jobs in one statement) and `--batch-commit` (finish them in one commit,
each fenced in a savepoint: one fsync per batch, but a crash loses the whole batch's finishes),
`--backoff S`, `--poll S`, `--max-outage S`, `--fair round-robin|limit=N`, `--lossy-claim`
(a claim made on its own commits without a WAL flush: a server crash right after it can hand
the same attempt number out twice); `python -m {name} worker --help` lists them.

Stopping: the first SIGTERM (or SIGINT) stops a worker after its current job (or batch); a
second one stops it at once (exit 130): the job in flight is rolled back and, once its lease
runs out, retried, counted. Give a worker the length of its longest job between the two
(Kubernetes `terminationGracePeriodSeconds`, systemd `TimeoutStopSec`).

Exit statuses, for supervisors:

- `0` stopped (a signal, `--max-jobs`, `--until-empty`);
- `1` crashed: a bug (with a traceback);
- `2` bad configuration, one line on stderr saying what to fix: a malformed DSN, a failed
  login, a missing database, a server not reachable at start (host, port), the schema missing
  or behind, a missing grant, a handlers module that fails to import, no handlers. Restarting
  will not help (systemd `RestartPreventExitStatus=2`); `--debug` adds the traceback;
- `3` lost the server for longer than `--max-outage`: a server that was reachable and went away
  (without `--max-outage` a worker reconnects forever, with backoff, one log line per outage);
- `130` stopped at once by a second signal.

`reap`, `prune` and `migrate` use the same statuses.

## 5. Run the reaper (one per database) and prune history

    python -m {name} reap --loop 5
    python -m {name} prune --older-than 604800     # finished more than a week ago, in batches

The reaper moves jobs whose lease expired (by more than `--grace`, 30 s by default) and that
have no attempts left to `dead` (with `--requeue`, the others back to `queued`). It decides by
the clock: a live worker slower than its lease is fenced out; the heartbeat is what keeps live
jobs' leases fresh, and the grace what covers a late beat.
## 6. See the queue and act on it

    python -m {name} stats                 # per status, kind, tenant; oldest wait; idle kinds
    python -m {name} jobs --status dead --kind send_invoice
    python -m {name} show 42               # every attempt: worker, outcome, error
    python -m {name} retry 42              # or: retry --dead --kind K [--attempts N]
    python -m {name} cancel 42             # running: claim.cancelled() turns true, finish fenced

`--json` on each. Logs: failures at WARNING with their traceback, dead jobs at ERROR; `-v`
adds a line per job; `--log-format json` writes one object per line. `jobqueue.job_runs` keeps
every attempt's outcome and error.
"""


def export(target: str | Path, name: str = "jobqueue", *, force: bool = False) -> Path:
    """Write the package as `name` into directory `target`; return the package's directory.

    Raises ExportRefused when ``target/name`` holds files an earlier export did not write
    (unless `force`), ValueError for a name that is not a Python identifier.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"package name must be a Python identifier, not {name!r}")
    dest = Path(target) / name
    if dest.exists() and not dest.is_dir():
        raise ExportRefused(f"{dest} is a file, not a package directory: choose another "
                            "--name or DIR")
    earlier = written_before(dest)
    if earlier is None and dest.is_dir() and any(dest.iterdir()) and not force:
        raise ExportRefused(f"{dest} is not empty and is not an earlier export (no {MARKER}): "
                            "choose another --name or DIR, or pass --force to write into it "
                            "(same-named files overwritten, nothing deleted)")
    for listed in earlier or []:
        _remove(dest, listed)
    wrote: list[str] = []
    for pattern in FILES:
        for src in sorted(HERE.glob(pattern)):
            out = dest / src.relative_to(HERE)
            out.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text()
            if name != SOURCE:
                text = text.replace(SOURCE, name)
            out.write_text(text)
            wrote.append(src.relative_to(HERE).as_posix())
    (dest / "README.md").write_text(README.format(name=name, source=SOURCE, marker=MARKER))
    wrote.append("README.md")
    # Written last: an export cut short leaves no list, so the next one asks for --force
    # rather than trusting a list that does not match what is there.
    (dest / MARKER).write_text(f"# Written by `tenantlab export-worker` from {SOURCE}; the next "
                               "export replaces these files (and no others).\n"
                               + "".join(f"{rel}\n" for rel in wrote))
    return dest


def written_before(dest: Path) -> list[str] | None:
    """Return the files an earlier export wrote into `dest`, or None if it was not one."""
    marker = dest / MARKER
    if not marker.is_file():
        return None
    return [line.strip() for line in marker.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def _remove(dest: Path, rel: str) -> None:
    """Remove one file an earlier export listed, and its directories once they are empty."""
    path = (dest / rel).resolve()
    root = dest.resolve()
    if not path.is_relative_to(root) or path == root:
        return  # a list edited to point outside the package: not ours
    if path.is_file():
        path.unlink()
    parent = path.parent
    while parent != root and parent.is_relative_to(root) and parent.is_dir() \
            and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
