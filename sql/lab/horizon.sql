-- The xmin horizon: long transactions, VACUUM, and a queue that slows down while one is open.
-- No schema of its own: the experiments fill the jobs table of their scratch database, and the
-- partial index of the 'done' variant is created there only (see horizon_create_queued_index).

-- Run by tenantlab.experiments.horizon to queue the jobs the single fetcher drains.
-- name: horizon_fill_jobs
insert into jobs (tenant_id)
select 1 + mod(i, 100) from generate_series(1, %(n)s) as i;

-- Run by tenantlab.experiments.horizon and vacuum (as admin) after filling: a clean start.
-- name: horizon_vacuum_analyze_jobs
vacuum (analyze) jobs;

-- Run by tenantlab.experiments.horizon (as admin) for the 'done' variant: the article's partial
-- index on queued jobs, so the claim need not look at finished ones.
-- name: horizon_create_queued_index
create index jobs_queued on jobs (id) where status = 'queued';

-- Run by tenantlab.experiments.horizon: the article's shortest fetch, one job per statement.
-- name: horizon_fetch_delete
delete from jobs
where id = (select id from jobs order by id limit 1 for update skip locked)
returning id;

-- Run by tenantlab.experiments.horizon: the same fetch, but marking the job done instead.
-- name: horizon_fetch_done
update jobs set status = 'done'
where id = (select id from jobs where status = 'queued' order by id limit 1
            for update skip locked)
returning id;

-- Run by tenantlab.experiments.horizon at the half-way point (in a transaction rolled back).
-- name: horizon_explain_fetch_delete
explain (analyze, buffers, format json)
delete from jobs
where id = (select id from jobs order by id limit 1 for update skip locked)
returning id;

-- Run by tenantlab.experiments.horizon at the half-way point (in a transaction rolled back).
-- name: horizon_explain_fetch_done
explain (analyze, buffers, format json)
update jobs set status = 'done'
where id = (select id from jobs where status = 'queued' order by id limit 1
            for update skip locked)
returning id;

-- Run by a holder (horizon, vacuum, monitor): give the open transaction a transaction id
-- without writing a row, as any transaction that writes would have.
-- name: holder_take_xid
select pg_current_xact_id()::text::bigint as xid;

-- Run by a read-only holder (a report, a pg_dump): under REPEATABLE READ its first statement
-- takes the snapshot the transaction keeps until it ends.
-- name: holder_read_jobs
select count(*) from jobs;

-- Run by a holder on its own session only (never globally): end it when idle in a transaction.
-- name: holder_set_idle_timeout
select set_config('idle_in_transaction_session_timeout', %(timeout)s, false);

-- Run by tenantlab.monitor: the sessions that hold the xmin horizon, oldest first. A session
-- holds it with a transaction id (it wrote, or locked a row) or with a snapshot (backend_xmin).
-- name: monitor_horizon_holders
select pid, datname, application_name, backend_type, state,
       backend_xid::text as backend_xid, backend_xmin::text as backend_xmin,
       greatest(age(backend_xid), age(backend_xmin)) as xid_age,
       extract(epoch from clock_timestamp() - xact_start)::float8 as xact_seconds,
       extract(epoch from clock_timestamp() - state_change)::float8 as state_seconds,
       left(query, 80) as query
from pg_stat_activity
where (backend_xid is not null or backend_xmin is not null)
  and pid <> pg_backend_pid()
order by greatest(age(backend_xid), age(backend_xmin)) desc, xact_start
limit %(limit)s;

-- Run by tenantlab.monitor: live and dead row versions of the jobs table, and its vacuums.
-- name: monitor_jobs_tuples
select n_live_tup, n_dead_tup, n_tup_del, n_tup_upd,
       vacuum_count, autovacuum_count, last_autovacuum
from pg_stat_user_tables
where relid = to_regclass('jobs');

-- Run by tenantlab.experiments.vacuum (as admin, autocommit): its INFO lines are parsed.
-- name: vacuum_verbose_jobs
vacuum (verbose) jobs;
