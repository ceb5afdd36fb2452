"""Nothing held while a handler does not write: no snapshot, no horizon held back.

Handlers as users write them: one that does nothing with the database (it sleeps), one that
reads with parameters and then waits. While each runs, the worker's session has no
backend_xmin, and VACUUM of another table removes the rows deleted meanwhile. Before the fix,
the start's unnamed portal (a query with parameters) kept its snapshot for the whole job: 1,000
rows "dead but not yet removable".

A batch in one transaction (``--batch-commit``) is the exception, by design and documented: it
locks its jobs' rows at its start (so each job's fence holds to the commit), and a row lock takes
a transaction id, which holds the horizon until the batch commits. The test says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from conftest import Scratch

from jobqueue import Claim, Handlers, Leased, enqueue

HANDLER_SECONDS = 1.5


def sleeps(conn: psycopg.Connection, job: Claim) -> None:
    time.sleep(HANDLER_SECONDS)


def reads_then_waits(conn: psycopg.Connection, job: Claim) -> None:
    conn.execute("select count(*) from jobqueue.jobs where tenant_id = %s",
                 (job.tenant_id,)).fetchone()
    time.sleep(HANDLER_SECONDS)


def _measure(s: Scratch, handler: Callable[..., None], batch: int,
             together: bool = False) -> tuple[Any, str]:
    """Run one job (or a batch) with the handler; while it runs, read the worker's backend_xmin
    and VACUUM another table whose rows were just deleted. Return (xmin, VACUUM's tuples line)."""
    with s.connect("admin", autocommit=True) as admin:
        for _ in range(batch):
            enqueue(admin, "work", tenant=1)
        admin.execute("create table other (x int)")
        admin.execute("insert into other select generate_series(1, 1000)")
    handlers = Handlers()
    handlers.add("work", handler)
    queue = Leased(handlers)
    errors: list[BaseException] = []
    with s.connect("worker", "horizon worker", autocommit=True) as conn:
        pid = conn.info.backend_pid

        def work() -> None:
            try:
                claims = queue.claim_many(conn, batch, worker="w")
                assert len(claims) == batch
                if together:  # one transaction, a savepoint per job
                    queue.run_together(conn, claims)
                else:
                    for claim in claims:
                        queue.run_claimed(conn, claim)
            except BaseException as e:  # reported by the test
                errors.append(e)

        t = threading.Thread(target=work)
        t.start()
        try:
            with s.connect("admin", autocommit=True) as admin:
                deadline = time.monotonic() + 10
                while True:  # until the handler runs
                    state = admin.execute("select state, backend_xmin from pg_stat_activity "
                                          "where pid = %s", (pid,)).fetchone()
                    if state and state[0] == "idle in transaction":
                        xmin = state[1]
                        break
                    assert time.monotonic() < deadline, "the handler never ran"
                    time.sleep(0.02)
                admin.execute("delete from other")
                notices: list[str] = []
                admin.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
                admin.execute("vacuum (verbose) other")
        finally:
            t.join()
    assert not errors, errors
    tuples = next(line for n in notices for line in n.splitlines() if line.startswith("tuples:"))
    return xmin, tuples


@pytest.mark.parametrize("handler,batch", [(sleeps, 1), (reads_then_waits, 1)],
                         ids=["sleeps", "reads-then-waits"])
def test_a_handler_that_does_not_write_holds_no_horizon(scratch: Scratch,
                                                        handler: Callable[..., None],
                                                        batch: int) -> None:
    xmin, tuples = _measure(scratch, handler, batch)
    assert xmin is None, f"the worker held a snapshot (backend_xmin {xmin}) while its handler ran"
    assert tuples.startswith("tuples: 1000 removed"), tuples


def test_a_batch_in_one_commit_holds_the_horizon_from_its_start(scratch: Scratch) -> None:
    # The documented price of --batch-commit: its row locks (each fence held to the commit) take
    # a transaction id at the batch's start; no snapshot, but VACUUM keeps what died meanwhile.
    xmin, tuples = _measure(scratch, reads_then_waits, 2, together=True)
    assert xmin is None, f"the worker held a snapshot (backend_xmin {xmin}) while its handler ran"
    assert "1000 are dead but not yet removable" in tuples, tuples
