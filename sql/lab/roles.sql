-- Roles are cluster-wide: created once by the admin connection, reused by every database.
-- tenantlab_owner owns the tables; tenantlab_worker is what a worker logs in as: an ordinary
-- login role, not the owner, not superuser, no BYPASSRLS, so row-level security applies to it.
-- The admin may be a superuser or a managed-service role (CREATEROLE, CREATEDB, pg_monitor; no
-- superuser): nothing here needs more than that.

-- Run by tenantlab.db.ensure_template on every set-up, before the template is (re)built.
-- name: create_roles
do $$
declare
  am_super boolean := (select rolsuper from pg_roles where rolname = current_user);
  -- 16+: membership has separate SET and INHERIT options, and granting needs ADMIN on the role.
  v16 boolean := current_setting('server_version_num')::int >= 160000;
  kit_role text;
begin
  if not exists (select from pg_roles where rolname = 'tenantlab_owner') then
    create role tenantlab_owner nologin;
  end if;
  if not exists (select from pg_roles where rolname = 'tenantlab_worker') then
    create role tenantlab_worker login noinherit;
  end if;
  -- An existing role may have been altered by hand: restore the attributes the lessons rely on.
  -- Only what differs: naming SUPERUSER or BYPASSRLS at all needs a superuser (15 and 17).
  foreach kit_role in array array['tenantlab_owner', 'tenantlab_worker'] loop
    if exists (select from pg_roles where rolname = kit_role and (rolsuper or rolbypassrls)) then
      execute format('alter role %I nosuperuser nobypassrls', kit_role);
    end if;
  end loop;
  if exists (select from pg_roles where rolname = 'tenantlab_worker'
             and (not rolcanlogin or rolcreatedb or rolcreaterole or rolinherit)) then
    alter role tenantlab_worker login nocreatedb nocreaterole noinherit;
  end if;
  if am_super then
    return;  -- a superuser may do all that follows without membership
  end if;
  -- A managed admin acts through membership: SET to create databases owned by the owner role,
  -- INHERIT to own them (rename, comment, drop, clone) and to reach the owner's tables; in the
  -- worker role to end its sessions (DROP DATABASE ... WITH (FORCE)).
  foreach kit_role in array array['tenantlab_owner', 'tenantlab_worker'] loop
    if v16 then
      if not (pg_has_role(current_user, kit_role, 'SET') and pg_has_role(current_user, kit_role, 'USAGE')) then
        execute format('grant %I to current_user with inherit true, set true', kit_role);
      end if;
    elsif not pg_has_role(current_user, kit_role, 'USAGE') then
      execute format('grant %I to current_user', kit_role);
    end if;
  end loop;
end
$$;

-- Run by tenantlab.db.role_facts (notebook 00, tests): what each role may do.
-- name: role_facts
select rolname as role, rolsuper as superuser, rolbypassrls as bypassrls,
       rolcanlogin as login, rolinherit as inherit
from pg_roles
where rolname in ('tenantlab_owner', 'tenantlab_worker')
order by rolname;

-- Run by tenantlab.db.uninstall: the databases the kit made (stamped with its schema version,
-- or a template build that was interrupted), never a database of the same prefix it did not.
-- name: kit_databases
select datname from pg_database
where datname like 'tenantlab\_%%'
  and (shobj_description(oid, 'pg_database') like 'tenantlab schema %%'
       or datname = 'tenantlab_template_building')
order by datname = 'tenantlab_template', datname;

-- Run by tenantlab.db.uninstall: the kit's roles that exist on this server (with any exercise
-- check's role a killed kernel left behind, tenantlab/exercises/_sandbox.py).
-- name: kit_roles
select rolname from pg_roles
 where rolname in ('tenantlab_worker', 'tenantlab_owner')
    or rolname ~ '^tenantlab_ex_[0-9a-f]+_[wo]$'
order by rolname desc;

-- Run by tenantlab.db.ensure_roles first: what the admin may do, to name what it lacks.
-- name: admin_privileges
select current_user as admin, rolsuper as superuser, rolcreaterole as createrole,
       rolcreatedb as createdb, pg_has_role(current_user, 'pg_monitor', 'USAGE') as pg_monitor
from pg_roles where rolname = current_user;
