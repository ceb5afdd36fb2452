"""Write this package into a directory as a standalone package an application can vendor.

``export(DIR, name="jobqueue")`` copies the modules and the SQL, renames the package in the
text where the name differs (its imports are relative, only docstrings and the command line
name it), and adds a README: apply the schema, register a handler, run workers and the reaper.
Nothing in DIR imports the kit it came from.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = __package__ or "jobqueue"
FILES = ("*.py", "sql/*.sql")

README = """\
# {name}: a PostgreSQL job queue with counted attempts, leases and a fenced finish

Exported from tenantlab ({source}). Needs Python 3.12+, psycopg 3.2+ and PostgreSQL 15+.

## 1. Apply the schema (once, as the tables' owner)

    python -m {name} schema --dsn "$OWNER_DSN"

or run `{name}/sql/schema.sql` in your migrations. Then let the worker role in (an ordinary
login role: not the owner, not superuser, no BYPASSRLS, so your row-level security applies):

    grant select, insert, update, delete on jobs, job_runs to app_worker;
    grant select, insert, update on tenant_turns to app_worker;  -- for --fair round-robin
    alter role app_worker set idle_in_transaction_session_timeout = '5min';
    alter role app_worker set statement_timeout = '10min';

The two timeouts end a worker session that hangs, so its job's lease runs out and another
worker retries it (counted) instead of it waiting forever: `idle_in_transaction_session_timeout`
must be longer than the longest pause a handler takes between two of its statements (the job's
transaction stays open while the handler works: an API call, a render), `statement_timeout`
longer than its slowest statement. An idle worker sits outside any transaction, so neither
ends it. Keep `jobs` out of tenant policies: a worker sees every job before it knows which
tenant to become.

## 2. Register a handler and queue jobs

    # myapp/jobs.py
    from {name} import handlers, enqueue

    @handlers.register("send_invoice")
    def send_invoice(conn, job):
        # conn: inside the job's transaction, app.tenant already set (locally) to job.tenant_id
        conn.execute("update invoices set sent = now() where id = %s", (job.payload["invoice"],))

    # anywhere in the application, in its own transaction:
    enqueue(conn, "send_invoice", tenant=42, payload={{"invoice": 7}})

A handler's writes commit with the job's completion or not at all; an exception fails the
attempt (counted; retried after a backoff; dead at max_attempts). A kind without a handler
fails the same way, with an error naming the kinds the worker knows.

## 3. Run workers

    JOBQUEUE_DSN=postgresql://app_worker@db/app python -m {name} --handlers myapp.jobs

Options: `--lease S`, `--heartbeat S` (< lease) with `--max-runtime S`, `--batch N` (claim
N jobs in one statement) and `--batch-commit` (finish them in one commit, each fenced in a
savepoint: one fsync per batch, but a crash loses the whole batch's finishes), `--backoff S`,
`--poll S`, `--max-outage S`; `python -m {name} worker --help` lists them. The claim is
durable by default; `--lossy-claim` skips its WAL flush and can, if the server crashes right
after a claim, hand the same attempt number out twice.
SIGTERM or SIGINT stops a worker after its current job. Exit statuses: 0 stopped, 1 crashed,
2 bad configuration, 3 lost the server for longer than `--max-outage` (otherwise it
reconnects forever, with backoff, logging one line per outage).

## 4. Run the reaper (one per database) and prune history

    python -m {name} reap --loop 5
    python -m {name} prune --older-than 604800     # finished more than a week ago, in batches

The reaper moves jobs whose lease expired and that have no attempts left to `dead` (with
`--requeue`, the others back to `queued`). It decides by the clock: a live worker slower than
its lease is fenced out; a heartbeat is what keeps live jobs' leases fresh.
"""


def export(target: str | Path, name: str = "jobqueue") -> Path:
    """Write the package as `name` into directory `target`; return the package's directory."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"package name must be a Python identifier, not {name!r}")
    root = Path(target)
    dest = root / name
    if dest.exists():
        shutil.rmtree(dest)
    for pattern in FILES:
        for src in sorted(HERE.glob(pattern)):
            out = dest / src.relative_to(HERE)
            out.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text()
            if name != SOURCE:
                text = text.replace(SOURCE, name)
            out.write_text(text)
    (root / "README.md").write_text(README.format(name=name, source=SOURCE))
    return dest
