-- The exercises' guards (tenantlab/exercises): what an answer may not change. No DDL here.

-- Run by tenantlab.exercises as admin, before and after a participant's answer ran: one line
-- per fact the lessons rely on (policies, row security, grants, columns, constraints, functions,
-- triggers, the kit's roles). A line that differs afterwards is something the answer changed.
-- name: exercise_rules
select 'policy ' || polrelid::regclass || ' ' || polname || ' for ' || polcmd::text
       || ' to ' || polroles::regrole[]::text || ' using ' || coalesce(pg_get_expr(polqual, polrelid), '-')
       || ' check ' || coalesce(pg_get_expr(polwithcheck, polrelid), '-') as fact
  from pg_policy
union all
select 'row security ' || c.oid::regclass || ': '
       || case when c.relrowsecurity then 'enabled' else 'disabled' end
       || case when c.relforcerowsecurity then ', forced' else '' end
  from pg_class c
 where c.relnamespace in ('public'::regnamespace, 'jobqueue'::regnamespace)
   and c.relkind in ('r', 'p')
union all
select 'grants on ' || c.oid::regclass || ': ' || coalesce(c.relacl::text, 'default')
       || ', owner ' || pg_get_userbyid(c.relowner)
  from pg_class c
 where c.relnamespace in ('public'::regnamespace, 'jobqueue'::regnamespace)
   and c.relkind in ('r', 'p', 'v', 'S')
union all
select 'column ' || a.attrelid::regclass || '.' || a.attname || ' '
       || format_type(a.atttypid, a.atttypmod)
  from pg_attribute a join pg_class c on c.oid = a.attrelid
 where c.relnamespace in ('public'::regnamespace, 'jobqueue'::regnamespace)
   and c.relkind in ('r', 'p', 'v') and a.attnum > 0 and not a.attisdropped
union all
select 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
  from pg_constraint
 where connamespace in ('public'::regnamespace, 'jobqueue'::regnamespace)
union all
select 'function ' || p.oid::regprocedure::text
  from pg_proc p
 where p.pronamespace in ('public'::regnamespace, 'jobqueue'::regnamespace)
union all
select 'trigger ' || tgrelid::regclass || ' ' || tgname from pg_trigger where not tgisinternal
union all
select 'schema ' || nspname || ': ' || coalesce(nspacl::text, 'default')
  from pg_namespace where nspname in ('public', 'jobqueue')
union all
select 'role ' || rolname || ':' || case when rolsuper then ' superuser' else '' end
       || case when rolbypassrls then ' bypassrls' else '' end
       || case when rolcreaterole then ' createrole' else '' end
       || case when rolcreatedb then ' createdb' else '' end
       || ' member of ' || coalesce((select string_agg(pg_get_userbyid(m.roleid), ', ' order by 1)
                                       from pg_auth_members m where m.member = r.oid), 'nothing')
  from pg_roles r where rolname in ('tenantlab_worker', 'tenantlab_owner')
order by 1;

-- Run by tenantlab.exercises as admin around each statement of an answer that claims or
-- finishes: every job's state, to see which jobs the statement changed.
-- name: exercise_jobs
select id, tenant_id, kind, status, attempts, max_attempts, locked_until, run_after
  from jobs order by id;

-- Run by the rls-jobs exercise as admin after the participant's migration: how row security
-- stands on jobs, how many policies it has, and how many of them are FOR SELECT only.
-- name: exercise_jobs_rls
select c.relrowsecurity, c.relforcerowsecurity,
       (select count(*) from pg_policy p where p.polrelid = c.oid),
       (select count(*) from pg_policy p where p.polrelid = c.oid and p.polcmd = 'r')
  from pg_class c where c.oid = 'jobs'::regclass;
