-- Tenants and their invoices, as in the article: 100 tenants, tenant t has floor(20000 / t)
-- invoices (103,707 in all). Row-level security is FORCEd, so even the owner obeys the policy.
create table tenants (
  id   int primary key,
  name text not null
);

create table invoices (
  id           bigint generated always as identity primary key,
  tenant_id    int not null references tenants,
  amount_cents int not null constraint amount_not_negative check (amount_cents >= 0),
  issued_on    date not null
);

insert into tenants (id, name)
select t, 'tenant ' || t from generate_series(1, 100) as t;

-- Seeded before the policy exists: the policy would refuse rows inserted without a tenant.
insert into invoices (tenant_id, amount_cents, issued_on)
select t, (t * 7919 + i * 104729) % 100000, date '2026-01-01' + (i % 365)
from generate_series(1, 100) as t, generate_series(1, 20000 / t) as i;

create index invoices_tenant_id on invoices (tenant_id);

alter table invoices enable row level security;
alter table invoices force row level security;
create policy tenant_isolation on invoices
  using (tenant_id = nullif(current_setting('app.tenant', true), '')::int);

grant select on tenants, invoices to tenantlab_worker;

-- Run by every job kind that reads tenant data: what the current tenant context can see.
-- name: count_invoices
select count(*) from invoices;

-- Run by tenantlab.db.rls_facts (notebook 00, tests): the policy as PostgreSQL stores it.
-- name: invoice_policy
select c.relrowsecurity as enabled, c.relforcerowsecurity as forced,
       p.polname as policy, pg_get_expr(p.polqual, p.polrelid) as using_expr,
       pg_get_userbyid(c.relowner) as owner
from pg_class c join pg_policy p on p.polrelid = c.oid
where c.oid = 'invoices'::regclass;

-- Run by tests and notebook 00: invoices per tenant as the admin sees them (no policy).
-- name: invoices_per_tenant
select tenant_id, count(*) as invoices from invoices group by tenant_id order by tenant_id;
