-- The exercises' guards (tenantlab/exercises): what an answer may not change. No DDL here.

-- Run by tenantlab.exercises as admin, before and after a participant's answer ran: one line
-- per fact the lessons rely on (policies, row security, grants, columns, constraints, functions,
-- triggers, rules, extensions; the cluster's roles, memberships, role and database settings,
-- tablespaces). A line that differs afterwards is something the answer changed.
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
select 'rule ' || ev_class::regclass || ' ' || rulename
  from pg_rewrite where rulename <> '_RETURN'
union all
select 'extension ' || extname from pg_extension
union all
-- The cluster: the roles that matter (the kit's, this check's own, and every role that is
-- or holds more than an ordinary login: superuser, CREATEROLE, CREATEDB, BYPASSRLS,
-- replication), the memberships that lead to them or to a predefined role, the role settings
-- of those roles and of all roles, the settings and rights of the server's own databases and
-- of this one. Ordinary roles and databases that other work makes meanwhile (a room's checks,
-- another test) are left out: that an answer cannot make those is the rights' job.
select 'role ' || rolname || ':' || case when rolsuper then ' superuser' else '' end
       || case when rolbypassrls then ' bypassrls' else '' end
       || case when rolcreaterole then ' createrole' else '' end
       || case when rolcreatedb then ' createdb' else '' end
       || case when rolreplication then ' replication' else '' end
       || case when rolcanlogin then ' login' else '' end
  from pg_roles r
 where rolname in ('tenantlab_owner', 'tenantlab_worker') or rolname = any(%(mine)s::text[])
    or rolsuper or rolcreaterole or rolcreatedb or rolbypassrls or rolreplication
union all
select 'member ' || pg_get_userbyid(m.member) || ' of ' || pg_get_userbyid(m.roleid)
  from pg_auth_members m join pg_roles r on r.oid = m.roleid
 where r.rolname in ('tenantlab_owner', 'tenantlab_worker') or r.rolname ~ '^pg_'
    or r.rolsuper or r.rolcreaterole or r.rolcreatedb or r.rolbypassrls
    or pg_get_userbyid(m.member) = any(%(mine)s::text[])
union all
select 'setting of role ' || coalesce(r.rolname, 'all') || ' in database '
       || coalesce(d.datname, 'all') || ': ' || array_to_string(s.setconfig, ', ')
  from pg_db_role_setting s
  left join pg_roles r on r.oid = s.setrole
  left join pg_database d on d.oid = s.setdatabase
 where (r.rolname is null or r.rolname in ('tenantlab_owner', 'tenantlab_worker')
        or r.rolname = any(%(mine)s::text[])
        or r.rolsuper or r.rolcreaterole or r.rolcreatedb or r.rolbypassrls)
   and (d.datname is null or d.datname = current_database()
        or d.datname in ('postgres', 'template1', 'tenantlab_template', 'tenantlab_playground'))
union all
select 'database ' || datname || ': owner ' || pg_get_userbyid(datdba)
       || ', ' || coalesce(datacl::text, 'default')
  from pg_database
 where datname = current_database()
    or datname in ('postgres', 'template1', 'tenantlab_template', 'tenantlab_playground')
union all
select 'tablespace ' || spcname from pg_tablespace
order by 1;

-- Run by tenantlab.exercises as admin around each statement of an answer that claims or
-- finishes: every job's state, to see which jobs the statement changed.
-- name: exercise_jobs
select id, tenant_id, kind, payload, status, attempts, max_attempts, locked_until, run_after,
       coalesce(locked_until > clock_timestamp(), false) as leased
  from jobs order by id;

-- Run by the exercises as admin to let time pass without waiting: the running jobs' leases
-- run out now (the worker that held one died, or works past it).
-- name: exercise_expire_leases
update jobs set locked_until = clock_timestamp() - interval '1 millisecond'
 where status = 'running' and locked_until > clock_timestamp();

-- Run by the overrun exercise as admin: the job's attempts before the race (a job retried
-- before), so that a finish that hard-codes an attempt number is seen.
-- name: exercise_set_attempts
update jobs set attempts = %(attempts)s, max_attempts = %(max_attempts)s where id = %(id)s;

-- Run by the rls-jobs exercise as admin after the participant's migration: how row security
-- stands on jobs, how many policies it has, and how many of them are FOR SELECT only.
-- name: exercise_jobs_rls
select c.relrowsecurity, c.relforcerowsecurity,
       (select count(*) from pg_policy p where p.polrelid = c.oid),
       (select count(*) from pg_policy p where p.polrelid = c.oid and p.polcmd = 'r')
  from pg_class c where c.oid = 'jobs'::regclass;

-- Run by the overrun exercise as admin: the queue's other jobs wait (not due for an hour), so
-- that the race's claims take the run's job.
-- name: exercise_hold_others
update jobs set run_after = clock_timestamp() + interval '1 hour' where id <> %(id)s;
