-- Tenant context: the app.tenant setting the invoices policy reads. No DDL here.
-- The session form (is_local = false) outlives the transaction and so the job; the local form
-- (is_local = true) ends with the transaction, whatever its outcome. The tenant is always a
-- bound parameter (text: set_config takes text).

-- Run by tenantlab.tenant.set_tenant(local=False): the leaky form, kept to demonstrate the leak.
-- name: tenant_set_session
select set_config('app.tenant', %(tenant)s, false);

-- The local form (tenant_set_local) is the corrected worker's: jobqueue/src/jobqueue/sql/queries.sql.

-- Run by the leak experiment's borrower: which tenant context a connection carries ('' or null: none).
-- name: tenant_current
select current_setting('app.tenant', true);

-- Run by the pool reset functions in tenantlab.tenant: forget the session-form tenant.
-- name: tenant_reset
reset app.tenant;

-- Run by tenantlab.tenant.discard_all (a pool reset function): drop all session state,
-- prepared statements included. Cannot run inside a transaction block.
-- name: tenant_discard_all
discard all;

-- Run by the leak experiment's failing job, after it set the tenant and counted: the job fails.
-- name: tenant_failing_work
select 1 / 0;
