-- The exercises' sandbox (tenantlab/exercises/_sandbox.py): an answer logs in as a role made for
-- its check, which holds the worker role's grants in the check's scratch database and nothing
-- else (08: it owns the jobs table there too). Safety comes from these rights, never from
-- reading the answer's words. Roles are named by the kit (tenantlab_ex_<hex>_<w|o>), never by
-- an answer; the DDL that makes and drops them is composed with psycopg.sql in the module.

-- Run by tenantlab.exercises._sandbox in the scratch database as admin: one GRANT per object
-- the worker role may use (tables, views, sequences, their columns, schemas, functions), for
-- the check's role. Built with format(%I): names are quoted, never pasted.
-- name: sandbox_grants
select format('grant %%s on table %%s to %%I',
              string_agg(distinct a.privilege_type, ', '), c.oid::regclass, %(role)s::text)
  from pg_class c, aclexplode(c.relacl) a
 where a.grantee = %(from)s::regrole and c.relkind in ('r', 'p', 'v', 'm', 'f')
 group by c.oid
union all
select format('grant %%s on sequence %%s to %%I',
              string_agg(distinct a.privilege_type, ', '), c.oid::regclass, %(role)s::text)
  from pg_class c, aclexplode(c.relacl) a
 where a.grantee = %(from)s::regrole and c.relkind = 'S'
 group by c.oid
union all
select format('grant %%s (%%I) on table %%s to %%I', a.privilege_type, att.attname,
              att.attrelid::regclass, %(role)s::text)
  from pg_attribute att, aclexplode(att.attacl) a
 where a.grantee = %(from)s::regrole and att.attnum > 0 and not att.attisdropped
union all
select format('grant %%s on schema %%I to %%I',
              string_agg(distinct a.privilege_type, ', '), n.nspname, %(role)s::text)
  from pg_namespace n, aclexplode(n.nspacl) a
 where a.grantee = %(from)s::regrole
 group by n.nspname
union all
select format('grant execute on function %%s to %%I', p.oid::regprocedure, %(role)s::text)
  from pg_proc p, aclexplode(p.proacl) a
 where a.grantee = %(from)s::regrole and a.privilege_type = 'EXECUTE';

-- Run by tenantlab.exercises._sandbox (exercise 08) in the scratch database as admin after the
-- answer's migration: the policies on jobs that name the worker role, with the statement that
-- makes them name the check's worker instead (it stands in for tenantlab_worker there). Only
-- the roles change; the policy's expressions stay the answer's.
-- name: sandbox_policy_roles
select format('alter policy %%I on %%s to %%s', p.polname, p.polrelid::regclass,
              (select string_agg(case when r = %(from)s::regrole then quote_ident(%(role)s::text)
                                      when r = 0 then 'public'
                                      else quote_ident(pg_get_userbyid(r)) end, ', ')
                 from unnest(p.polroles) as r))
  from pg_policy p
 where p.polrelid = 'jobs'::regclass and %(from)s::regrole = any(p.polroles);

-- Run by tenantlab.exercises._sandbox as admin after a check: transactions the check's roles
-- prepared (PREPARE TRANSACTION, when max_prepared_transactions > 0), which would outlive the
-- check's sessions and hold their locks and the horizon.
-- name: sandbox_prepared
select gid, owner from pg_prepared_xacts where database = current_database();

-- Run by tenantlab.exercises._sandbox as admin before each check: the check roles of checks
-- that ended without dropping them (a killed kernel), once they are past their VALID UNTIL and
-- have no session left. A check in progress elsewhere (a room on one server) is left alone.
-- name: sandbox_stale_roles
select r.rolname from pg_roles r
 where r.rolname ~ '^tenantlab_ex_[0-9a-f]+_[wo]$'
   and r.rolvaliduntil < clock_timestamp()
   and not exists (select from pg_stat_activity a where a.usename = r.rolname);

-- Run by tenantlab.exercises._sandbox as admin, once per check: whether the admin is a
-- superuser, the server's version (16+: membership has SET and INHERIT options), and the
-- check roles' VALID UNTIL (now + %(valid_for)s).
-- name: sandbox_admin
select rolsuper, current_setting('server_version_num')::int >= 160000 as v16,
       (clock_timestamp() + %(valid_for)s::interval)::text as valid_until
  from pg_roles where rolname = current_user;
