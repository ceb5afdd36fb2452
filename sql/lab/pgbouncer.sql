-- Through PgBouncer in transaction mode (finding pgbouncer): what a transaction sees of the
-- server connection it was handed, session state included. No DDL here.

-- Run by the finding's reader process: sets no tenant, reads what its server connection carries.
-- name: pgbouncer_read
select current_setting('app.tenant', true) as tenant,
       (select count(*) from invoices) as invoices,
       pg_backend_pid() as server;

-- Run by the finding's tenant jobs and probes: which server connection this transaction got.
-- name: pgbouncer_server
select pg_backend_pid();

-- Run by the advisory-lock probe: a session lock, which outlives the transaction that took it.
-- name: pgbouncer_lock
select pg_advisory_lock(%(key)s), pg_backend_pid();

-- Run by the advisory-lock probe: can another client take the same lock?
-- name: pgbouncer_try_lock
select pg_try_advisory_lock(%(key)s), pg_backend_pid();

-- Run by the advisory-lock probe (admin, direct): who holds the lock now.
-- name: pgbouncer_lock_holders
select pid from pg_locks where locktype = 'advisory' and objid::bigint = %(key)s and granted;

-- Run by the LISTEN probe: the wake-up channel a worker would wait on.
-- name: pgbouncer_listen
listen tenantlab_wake;

-- Run by the LISTEN probe (direct): what an enqueue would send.
-- name: pgbouncer_notify
select pg_notify('tenantlab_wake', %(payload)s);

-- Run by tenantlab.pgbouncer.PgBouncer.settings on PgBouncer's console (database pgbouncer).
-- name: pgbouncer_show_config
show config;

-- Run by tenantlab.pgbouncer.PgBouncer.settings on PgBouncer's console: "PgBouncer 1.18.0".
-- name: pgbouncer_show_version
show version;
