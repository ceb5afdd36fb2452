"""jobqueue's schema: its own namespace, numbered migrations, and the check a worker makes."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from jobqueue import ConfigError, migrations
from jobqueue.queries import SQL_DIR

# Every object of the schema jobqueue, as the catalog describes it (names, types, defaults,
# constraints, indexes, the view): what must not depend on how the schema was made.
CATALOG = """
select 'column', c.relname || '.' || a.attname,
       format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text || ' ' ||
       coalesce(pg_get_expr(d.adbin, d.adrelid), '') || ' ' || a.attidentity::text || a.attgenerated::text
  from pg_attribute a join pg_class c on c.oid = a.attrelid
  join pg_namespace n on n.oid = c.relnamespace
  left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
 where n.nspname = 'jobqueue' and a.attnum > 0 and not a.attisdropped
union all
select 'constraint', conrelid::regclass::text || '.' || conname, pg_get_constraintdef(oid)
  from pg_constraint where connamespace = 'jobqueue'::regnamespace
union all
select 'index', indexrelid::regclass::text, pg_get_indexdef(indexrelid)
  from pg_index where indrelid in (select oid from pg_class
                                    where relnamespace = 'jobqueue'::regnamespace)
union all
select 'view', c.oid::regclass::text, pg_get_viewdef(c.oid) || array_to_string(c.reloptions, ',')
  from pg_class c where c.relnamespace = 'jobqueue'::regnamespace and c.relkind = 'v'
union all
select 'type', t.typname, format_type(t.typbasetype, t.typtypmod)
  from pg_type t where t.typnamespace = 'jobqueue'::regnamespace and t.typtype = 'd'
union all
select 'function', p.oid::regprocedure::text,
       pg_get_functiondef(p.oid) || coalesce(array_to_string(p.proacl, ','), 'default')
  from pg_proc p where p.pronamespace = 'jobqueue'::regnamespace
order by 1, 2
"""


def as_owner(fresh: dict[str, str]) -> psycopg.Connection:
    conn = psycopg.connect(fresh["admin"], autocommit=True)
    conn.execute(sql.SQL("set role {}").format(sql.Identifier(fresh["owner"])))
    return conn


def test_migrate_applies_each_migration_once_in_its_own_schema(fresh_db: dict[str, str]) -> None:
    with as_owner(fresh_db) as conn:
        assert migrations.migrate(conn) == [name for _, name, _ in migrations.available()]
        assert migrations.migrate(conn) == []  # up to date: nothing applied twice
        versions = [r[0] for r in conn.execute(
            "select version from jobqueue.migrations order by version").fetchall()]
        assert versions == [v for v, _, _ in migrations.available()]
        assert max(versions) == migrations.latest()
        # Nothing of the queue's lands in public, where the application's own tables live.
        assert conn.execute("select count(*) from pg_class where relnamespace = "
                            "'public'::regnamespace").fetchone() == (0,)
        with pytest.raises(ConfigError, match="installed with bigint tenant ids, not uuid"):
            migrations.migrate(conn, tenant_type="uuid")
    with pytest.raises(ConfigError, match="tenant type must be one of bigint, integer, uuid"):
        migrations.migrate(None, tenant_type="int; drop table x")  # type: ignore[arg-type]


def test_migrate_never_adopts_an_existing_table_and_leaves_nothing_half_done(
        fresh_db: dict[str, str]) -> None:
    with as_owner(fresh_db) as conn:
        # An application that already has a schema of that name, with its own jobs table.
        conn.execute("create schema jobqueue")
        conn.execute("create table jobqueue.jobs (id int primary key, title text)")
        with pytest.raises(psycopg.errors.DuplicateTable):
            migrations.migrate(conn)
        # One transaction: no migration recorded, no domain, the application's table untouched.
        left = conn.execute("select relname from pg_class where relnamespace = "
                            "'jobqueue'::regnamespace order by 1").fetchall()
        assert left == [("jobs",), ("jobs_pkey",)]


def test_the_schema_file_is_the_migrations_applied_in_order(fresh_db: dict[str, str],
                                                            admin_dsn: str) -> None:
    with as_owner(fresh_db) as conn:
        migrations.migrate(conn)
        migrated = conn.execute(CATALOG).fetchall()
        conn.execute("drop schema jobqueue cascade")
        conn.execute((SQL_DIR / "schema.sql").read_text())  # type: ignore[arg-type]
        written = conn.execute(CATALOG).fetchall()
    assert len(migrated) > 30
    assert written == migrated


def test_a_worker_refuses_a_schema_that_is_missing_behind_or_not_granted(
        fresh_db: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(fresh_db["worker"], autocommit=True) as worker:
        with pytest.raises(ConfigError, match="has no jobqueue schema: run `migrate"):
            migrations.check(worker)
        with as_owner(fresh_db) as owner:
            migrations.migrate(owner)
        with pytest.raises(ConfigError, match="lacks usage on schema jobqueue"):
            migrations.check(worker)
        role = sql.Identifier(fresh_db["worker_role"])
        with as_owner(fresh_db) as owner:
            owner.execute(sql.SQL("grant usage on schema jobqueue to {}").format(role))
            owner.execute(sql.SQL("grant select on jobqueue.migrations, jobqueue.jobs to {}")
                          .format(role))
        with pytest.raises(ConfigError, match="lacks update on jobqueue.jobs, insert on "
                                              "jobqueue.job_runs, select on jobqueue.job_runs, "
                                              "select on jobqueue.claimable"):
            migrations.check(worker)
        with as_owner(fresh_db) as owner:
            owner.execute(sql.SQL("grant update on jobqueue.jobs to {r}; "
                                  "grant select, insert on jobqueue.job_runs to {r}; "
                                  "grant select, update on jobqueue.claimable to {r}")
                          .format(r=role))
        with pytest.raises(ConfigError, match="lacks select on jobqueue.workers, insert on "
                                              "jobqueue.workers, update on jobqueue.workers, "
                                              "delete on jobqueue.workers"):
            migrations.check(worker)
        with as_owner(fresh_db) as owner:
            owner.execute(sql.SQL("grant select, insert, update, delete on jobqueue.workers "
                                  "to {r}").format(r=role))
        migrations.check(worker)  # all there
        installed = migrations.latest()
        monkeypatch.setattr(migrations, "latest", lambda: installed + 1)
        with pytest.raises(ConfigError, match=f"at migration {installed}, this worker needs "
                                              f"{installed + 1}: run `migrate"):
            migrations.check(worker)
