-- The product on its own schema (tenantlab.db.install_product): the check suite's jobqueue row
-- and `tenantlab bench`'s production rows install it as an application does, `jobqueue migrate`
-- in a database without the lab's tables in the schema jobqueue, then the product README's
-- grants for the worker role. Run as the owner role.

-- Run by install_product first: the lab's jobqueue schema (its jobs table altered by
-- sql/lab/jobs.sql) goes, in that database only; the lab's own tables stay.
-- name: product_drop_lab_schema
drop schema if exists jobqueue cascade;

-- Run by install_product after `jobqueue migrate`: the worker role's grants, as the product's
-- README lists them (jobqueue/README.md, "Grant three roles").
-- name: product_grants
grant usage on schema jobqueue to tenantlab_worker;
grant select, insert, update, delete on jobqueue.jobs, jobqueue.job_runs to tenantlab_worker;
grant select, update on jobqueue.claimable to tenantlab_worker;
grant select on jobqueue.migrations to tenantlab_worker;
grant select, insert, update on jobqueue.tenant_turns to tenantlab_worker;
grant select, insert, update, delete on jobqueue.workers to tenantlab_worker;
grant select, insert, update on jobqueue.periodic to tenantlab_worker;
grant execute on function jobqueue.analyze_after_bulk(bigint) to tenantlab_worker;
