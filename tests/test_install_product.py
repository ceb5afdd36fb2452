"""The product on its own schema in the kit: what the check's jobqueue row and the bench run on."""

from __future__ import annotations

from jobqueue import Leased, enqueue, migrations

from tenantlab import db
from tenantlab.check.queues.jobqueue import JobQueue


def test_install_product_replaces_the_labs_schema_with_what_jobqueue_migrate_makes(
        scratch: db.Scratch) -> None:
    with scratch.connect("admin", "test product", autocommit=True) as admin:
        lab = {r[0] for r in admin.execute(
            "select attname from pg_attribute where attrelid = 'jobqueue.jobs'::regclass")}
    assert "seconds" in lab  # the lab's column (sql/lab/jobs.sql), not the product's
    JobQueue().install(scratch.admin)  # the check's row: db.install_product
    with scratch.connect("admin", "test product", autocommit=True) as admin:
        cols = {r[0] for r in admin.execute(
            "select attname from pg_attribute where attrelid = 'jobqueue.jobs'::regclass")}
        fks = admin.execute("select count(*) from pg_constraint where contype = 'f' "
                            "and conrelid = 'jobqueue.jobs'::regclass").fetchone()
        applied = [r[0] for r in admin.execute("select version from jobqueue.migrations")]
        owner = admin.execute("select nspowner::regrole::text from pg_namespace "
                              "where nspname = 'jobqueue'").fetchone()
    assert "seconds" not in cols and fks == (0,)
    assert applied == [v for v, _, _ in migrations.available()] and owner == (db.OWNER,)
    # The README's grants are enough for the worker role to queue, claim and finish.
    with scratch.connect("worker", "test product", autocommit=True) as conn:
        job = enqueue(conn, "x", tenant=1)
        outcome = Leased({"x": lambda c, j: "ok"}, heartbeat=None).run_one(conn)
    assert outcome is not None and (outcome.claim.id, outcome.status) == (job, "done")


def test_the_grants_are_the_products_readme_word_for_word() -> None:
    from pathlib import Path

    from tenantlab.queries import q

    readme = (Path(__file__).resolve().parent.parent / "jobqueue" / "README.md").read_text()
    said = [ln.split("--")[0].strip().replace(" to app_worker;", f" to {db.WORKER};")
            for ln in readme.splitlines()
            if ln.startswith("    grant ") and " to app_worker;" in ln]
    ours = [ln.strip() for ln in q("product_grants").splitlines() if ln.startswith("grant ")]
    assert ours == said
