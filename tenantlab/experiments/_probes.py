"""Finding ``pgbouncer``'s probes: what else of a session stops working through the pooler.

Each probe gets a PgBouncer of its own (pool of 2, LIFO as PgBouncer's default) in front of the
scratch database it is given, and two clients that take turns, so which server connection each
transaction gets is known: the same one, unless the other client holds it in a transaction.
Prepared statements: psycopg's automatic ones collide. A session advisory lock: it stays with the
server connection. LISTEN: it registers the server connection, not the client.
"""

from __future__ import annotations

from typing import Any

import psycopg

from .. import db, tenant
from .. import pgbouncer as pooler
from ..queries import q

LOCK_KEY = 0x7E4A48  # the advisory lock the probe takes (one above the template build's)
PROBE_JOBS = 20  # jobs per client in the prepared-statement probe: past psycopg's threshold (5)
LISTEN_WAIT = 1.0  # seconds a listener waits for the notification


def pooler_facts(pool_size: int) -> dict[str, Any]:
    """Return which PgBouncer runs, its version, mode, pool size and prepared-statement tracking."""
    with pooler.running(config=pooler.Config(pool_size=pool_size)) as b:
        settings = b.settings()
        where = f"external {b.host}:{b.port}" if b.external else "started by the kit"
    if settings.get("pool_mode") != "transaction":
        raise pooler.PgBouncerError(
            f"the PgBouncer at {b.host}:{b.port} pools in {settings.get('pool_mode')} mode: "
            "finding pgbouncer needs pool_mode = transaction")
    return {"pooler": where, "external": b.external, "version": settings["version"],
            "pool_mode": settings["pool_mode"], "pool_size": int(settings["default_pool_size"]),
            "max_prepared_statements": int(settings.get("max_prepared_statements") or 0)}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def prepared_probes(s: db.Scratch, facts: dict[str, Any]) -> dict[str, Any]:
    """Run the prepared-statement probe with psycopg's default, and with what should fix it."""
    tracks = _version(facts["version"]) >= pooler.PREPARED_STATEMENTS_SINCE
    # Our own pooler: tracking explicitly off (where it exists) for the default run; someone
    # else's: as it is configured (docker compose's PgBouncer 1.25 tracks them by default).
    off = 0 if tracks and not facts["external"] else None
    tracked = facts["external"] and facts["max_prepared_statements"] > 0
    default = prepared_statements(s, tenant.DEFAULT_PREPARE_THRESHOLD, off)
    fixed_by = []
    if prepared_statements(s, None)["failed_at"] is None:
        fixed_by.append("prepare_threshold=None")
    if tracked and default["failed_at"] is None:
        fixed_by.append(f"max_prepared_statements={facts['max_prepared_statements']}")
        note = f"measured: on, {facts['max_prepared_statements']} (the external PgBouncer's)"
    elif tracks and not facts["external"]:
        on = prepared_statements(s, tenant.DEFAULT_PREPARE_THRESHOLD, 100)
        if on["failed_at"] is None:
            fixed_by.append("max_prepared_statements=100")
        note = "measured: " + ("100, no job failed" if on["failed_at"] is None
                               else f"100, job {on['failed_at']} failed")
    elif tracks:
        note = "measured: off (0) on the external PgBouncer"
    else:
        note = (f"not measured: PgBouncer {facts['version']} here; max_prepared_statements "
                "arrives in PgBouncer 1.21")
    return {"default_failed_at": default["failed_at"], "default_error": default["error"],
            "default_failed": default["failed"], "default_jobs": default["jobs"],
            "default_failed_jobs": default["failed_jobs"],
            "fixed_by": fixed_by, "max_prepared_statements": note,
            "pooler_tracks_prepared": bool(tracked)}


def prepared_statements(s: db.Scratch, threshold: int | None,
                        max_prepared: int | None = None) -> dict[str, Any]:
    """Two clients take turns running the same job; return which jobs failed, and the first.

    Every job runs, a failed one rolled back: how often they fail over the run, not only when
    the first does.
    """
    config = pooler.Config(pool_size=2, max_prepared_statements=max_prepared)
    failed: list[int] = []
    first: dict[str, Any] = {"failed_at": None, "client": None, "error": None}
    with pooler.running(s.admin, config) as b:
        conns = [db.connect(b.through(s.worker), f"pgbouncer prepared {who}", autocommit=True,
                            prepare_threshold=threshold) for who in "AB"]
        try:
            for n in range(1, 2 * PROBE_JOBS + 1):
                who = "AB"[(n - 1) % 2]
                try:
                    with conns[(n - 1) % 2].transaction() as tx:
                        tenant.set_tenant(tx.connection, n % 100 + 1, local=True)
                        tenant.count_invoices(tx.connection)
                except psycopg.Error as e:
                    failed.append(n)
                    if first["failed_at"] is None:
                        first = {"failed_at": n, "client": who,
                                 "error": f"{type(e).__name__}: {e}"}
        finally:
            for conn in conns:
                conn.close()
    return {**first, "jobs": 2 * PROBE_JOBS, "failed": len(failed), "failed_jobs": failed}


def advisory_lock(s: db.Scratch) -> dict[str, Any]:
    """A takes a session lock in one transaction; what do B's later transactions see?"""
    with pooler.running(s.admin, pooler.Config(pool_size=2)) as b, \
            db.connect(s.admin, "pgbouncer lock watch", autocommit=True) as admin:
        a = db.connect(b.through(s.worker), "pgbouncer lock A", autocommit=True,
                       prepare_threshold=None)
        c = db.connect(b.through(s.worker), "pgbouncer lock B", autocommit=True,
                       prepare_threshold=None)
        try:
            _, a_server = a.execute(q("pgbouncer_lock"), {"key": LOCK_KEY}).fetchone() or (0, 0)
            holders = [r[0] for r in admin.execute(q("pgbouncer_lock_holders"), {"key": LOCK_KEY})]
            # B's next transaction: PgBouncer hands out the server connection used last (LIFO).
            same_got, same_server = c.execute(q("pgbouncer_try_lock"),
                                              {"key": LOCK_KEY}).fetchone() or (False, 0)
            # A busy in a transaction on its server connection: B gets the other one.
            with a.transaction():
                a_now = db.scalar(a, q("pgbouncer_server"))
                with c.transaction():
                    other_got, other_server = c.execute(
                        q("pgbouncer_try_lock"), {"key": LOCK_KEY}).fetchone() or (False, 0)
        finally:
            a.close()
            c.close()
    return {
        "a_locked_on": a_server, "held_after_commit_by": holders,
        "b_same_server": same_server == a_server, "b_same_server_got_lock": bool(same_got),
        "a_then_on": a_now, "b_other_server": other_server != a_server,
        "b_other_server_got_lock": bool(other_got),
        "crossed": bool(same_got) and same_server == a_server,
    }


def listen(s: db.Scratch) -> dict[str, Any]:
    """LISTEN through the pooler and directly; NOTIFY directly; who gets the notification?"""
    got = {}
    with pooler.running(s.admin, pooler.Config(pool_size=2)) as b, \
            db.connect(s.admin, "pgbouncer notify", autocommit=True) as admin:
        for how, dsn in (("pooler", b.through(s.worker)), ("direct", s.worker)):
            with db.connect(dsn, f"pgbouncer listen {how}", autocommit=True,
                            prepare_threshold=None) as conn:
                conn.execute(q("pgbouncer_listen"))
                admin.execute(q("pgbouncer_notify"), {"payload": f"wake {how}"})
                got[how] = [n.payload for n in conn.notifies(timeout=LISTEN_WAIT, stop_after=1)]
    return {"through_pooler": bool(got["pooler"]), "direct": bool(got["direct"])}
