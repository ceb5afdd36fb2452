-- Read-only looks at the catalog: what notebook 00 and the schema tests show.

-- Run by tenantlab.schema.tables (notebook 00): the lab's tables and their columns.
-- name: describe_columns
select c.table_name as "table", c.column_name as "column", c.data_type as "type",
       c.is_nullable = 'YES' as nullable, c.column_default as "default"
from information_schema.columns c
where c.table_schema in ('public', 'jobqueue')
order by c.table_name, c.ordinal_position;

-- Run by tenantlab.schema.constraints (notebook 00, tests): the invariants, by name.
-- name: describe_constraints
select conrelid::regclass::text as "table", conname as "constraint",
       pg_get_constraintdef(oid) as definition
from pg_constraint
where contype = 'c' and connamespace in ('public'::regnamespace, 'jobqueue'::regnamespace)
order by 1, 2;

-- Run by tenantlab.schema.facts (notebook 00, tests): who the worker is, and what it owns.
-- name: whoami
select current_user,
       pg_get_userbyid((select relowner from pg_class where oid = 'invoices'::regclass))
         = current_user as owns_invoices;

-- Run by tenantlab.db.leftover_backends (test suite, notebook 00): the kit's sessions, and its
-- workers' (the production loop names them 'jobqueue ...'), still there.
-- name: kit_sessions
select pid, datname, application_name, state, backend_type from pg_stat_activity
where (application_name like 'tenantlab%%' or application_name like 'jobqueue%%')
  and pid <> pg_backend_pid();

-- Run by tenantlab.db.scratch_databases (notebook 00): scratch databases that exist now.
-- name: scratch_databases
select datname from pg_database where datname like 'tenantlab\_%%\_%%\_%%' order by 1;

-- Run by tenantlab.db.schema_of: the comment that records a database's schema version.
-- name: database_comment
select shobj_description(oid, 'pg_database') from pg_database where datname = %(name)s;

-- Run by tenantlab.worker.playground_dsn around its check-and-clone: processes started together
-- (five `tenantlab enqueue` at once) clone the playground once, and none drops it under another.
-- name: playground_lock
select pg_advisory_lock(hashtext('tenantlab playground'));

-- name: playground_unlock
select pg_advisory_unlock(hashtext('tenantlab playground'));

-- Run by tenantlab.db.clean_scratch (`tenantlab clean-scratch`): the scratch databases nobody is
-- connected to, with the pid of the process that made each (its name's second-to-last part).
-- name: idle_scratch_databases
select d.datname, nullif(substring(d.datname from '_([0-9]+)_[0-9]+$'), '')::int as pid
  from pg_database d
 where d.datname like 'tenantlab\_%%\_%%\_%%'
   and not exists (select from pg_stat_activity a where a.datname = d.datname)
 order by 1;
