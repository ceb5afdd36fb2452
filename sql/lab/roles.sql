-- Roles are cluster-wide: created once by the admin connection, reused by every database.
-- tenantlab_owner owns the tables; tenantlab_worker is what a worker logs in as: an ordinary
-- login role, not the owner, not superuser, no BYPASSRLS, so row-level security applies to it.

-- Run by tenantlab.db.ensure_template before building the template database.
-- name: create_roles
do $$
begin
  if not exists (select from pg_roles where rolname = 'tenantlab_owner') then
    create role tenantlab_owner nologin nosuperuser nobypassrls;
  end if;
  if not exists (select from pg_roles where rolname = 'tenantlab_worker') then
    create role tenantlab_worker login nosuperuser nobypassrls nocreatedb nocreaterole noinherit;
  end if;
  -- An existing role may have been altered by hand: restore the attributes the lessons rely on.
  alter role tenantlab_worker login nosuperuser nobypassrls nocreatedb nocreaterole noinherit;
end
$$;

-- Run by tenantlab.db.role_facts (notebook 00, tests): what each role may do.
-- name: role_facts
select rolname as role, rolsuper as superuser, rolbypassrls as bypassrls,
       rolcanlogin as login, rolinherit as inherit
from pg_roles
where rolname in ('tenantlab_owner', 'tenantlab_worker')
order by rolname;
