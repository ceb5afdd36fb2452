-- The benchmark (tenantlab/bench.py, `tenantlab bench`): no DDL; it works in a scratch database.

-- Run by tenantlab.bench: the server settings that decide what a commit costs.
-- name: bench_setting
select current_setting(%(name)s);

-- Run by tenantlab.bench as admin: `n` jobs finished long ago, the history a queue lives with.
-- name: bench_fill_history
insert into jobs (tenant_id, kind, status, attempts, created, finished)
select 1 + g %% 100, 'noop', 'done', 1, clock_timestamp() - interval '1 day',
       clock_timestamp() - interval '1 day'
from generate_series(1, %(n)s::int) as g;

-- Run by tenantlab.bench as admin: `n` jobs scheduled for tomorrow, not yet due; inserted
-- before the ready jobs, so they sit in front of them in id order.
-- name: bench_fill_scheduled
insert into jobs (tenant_id, kind, status, run_after)
select 1 + g %% 100, 'noop', 'queued', clock_timestamp() + interval '1 day'
from generate_series(1, %(n)s::int) as g;

-- Run by tenantlab.bench as admin: `n` jobs that failed once and wait out their backoff (due in
-- a few minutes), in front of the ready jobs.
-- name: bench_fill_backoff
insert into jobs (tenant_id, kind, status, attempts, run_after, last_error)
select 1 + g %% 100, 'noop', 'queued', 1, clock_timestamp() + interval '5 minutes', 'bench'
from generate_series(1, %(n)s::int) as g;

-- Run by tenantlab.bench as admin: `n` jobs whose last attempt's worker died, lease run out,
-- attempts spent, not yet reaped: never claimable again, in front of the ready jobs.
-- name: bench_fill_exhausted
insert into jobs (tenant_id, kind, status, attempts, max_attempts, locked_until)
select 1 + g %% 100, 'noop', 'running', 3, 3, clock_timestamp() - interval '1 minute'
from generate_series(1, %(n)s::int) as g;

-- Run by tenantlab.bench: a no-op round trip, the floor under every design.
-- name: bench_select1
select 1;

-- Run by tenantlab.bench: the smallest durable commit, one round trip and one WAL flush (one
-- row written: a transaction that writes nothing but its id commits without waiting for a
-- flush): the floor under a design that flushes once per job.
-- name: bench_commit1
insert into job_writes (job_id, attempt, tenant_id) values (0, 0, 0);

-- Run by tenantlab.bench (admin) around each measurement: the server's WAL flushes so far, every
-- session's (PostgreSQL 15 to 17; 18 counts them in pg_stat_io, bench_wal_flushes_io).
-- name: bench_wal_flushes
select wal_sync from pg_stat_wal;

-- name: bench_wal_flushes_io
select coalesce(sum(fsyncs), 0) from pg_stat_io where object = 'wal';

-- Run by tenantlab.bench_profile (admin) around each row: the transactions ended and the time
-- sessions spent active (parse, plan, execute, commit with its WAL flush; ms) so far, in every
-- database but the profiler's own (PostgreSQL 14+).
-- name: bench_server_counts
select sum(xact_commit + xact_rollback), sum(active_time)
  from pg_stat_database where datname is distinct from current_database();

-- Run by tenantlab.bench_profile: whether pg_stat_statements is there to read, and whether
-- the server loads its library (then the profiler creates the extension, and drops it after).
-- name: bench_statements_installed
select exists (select from pg_extension where extname = 'pg_stat_statements');

-- name: bench_preloaded
select current_setting('shared_preload_libraries');

-- name: bench_statements_create
create extension if not exists pg_stat_statements;

-- name: bench_statements_drop
drop extension if exists pg_stat_statements;

-- Run by tenantlab.bench_profile around each row: every statement's calls and execution time
-- (ms) so far, per database and statement, but the profiler's own database.
-- name: bench_statements_read
select userid, dbid, queryid, toplevel, calls, total_exec_time
  from pg_stat_statements(false)
 where dbid <> (select oid from pg_database where datname = current_database());

-- Run by tenantlab.bench around a noisy-neighbour row: one database's statements, their first
-- words (whitespace folded), calls and execution time (ms) so far: its claim's cost per call.
-- name: bench_statements_of
select left(regexp_replace(query, '\s+', ' ', 'g'), 40) as query, calls, total_exec_time
  from pg_stat_statements(true)
 where dbid = (select oid from pg_database where datname = %(db)s);

-- Run by tenantlab.bench after an idle-latency run: from a job's insert to its execution's
-- start, in milliseconds (one server clock for both).
-- name: bench_latency_ms
select extract(epoch from r.started - j.created) * 1000 as ms
  from jobs j join job_runs r on r.job_id = j.id
 order by j.id;

-- Run by tenantlab.bench after worker processes drained the queue: from the first execution's
-- start to the last one's finish (process start-up left out).
-- name: bench_span
select count(*) as jobs, extract(epoch from max(finished) - min(started)) as seconds
  from job_runs where finished is not null;

-- Run by tenantlab.bench after worker processes drained the queue: the same, from the moment
-- the last worker started its first job (every worker running: their start-ups, a few hundred
-- ms of CPU each on a machine of few cores, left out) to the last finish, and the jobs that
-- started in it.
-- name: bench_span_all_running
with firsts as (select worker, min(started) as first from job_runs group by worker),
     t0 as (select max(first) as t0 from firsts)
select count(*) as jobs, extract(epoch from max(r.finished) - t0.t0) as seconds
  from job_runs r, t0
 where r.finished is not null and r.started >= t0.t0
 group by t0.t0;

-- Run by tenantlab.bench after a drain: when each execution finished, in seconds, in order
-- (the first tenth of a run against its last: flat, or slowing down as history piles up).
-- name: bench_finish_times
select extract(epoch from finished)::float8 from job_runs where finished is not null order by finished;

-- Run by tenantlab.bench as admin (claim_after_bulk): `n` dead jobs, attempts spent, for a
-- `retry --dead` to queue again at once.
-- name: bench_fill_dead
insert into jobs (tenant_id, kind, status, attempts, max_attempts, finished, last_error)
select 1 + g %% 100, 'noop', 'dead', 3, 3, clock_timestamp(), 'boom'
from generate_series(1, %(n)s::int) as g;

-- Run by tenantlab.bench as admin (claim_after_bulk): the statistics of the table as it is now
-- (empty, or only finished jobs), as autoanalyze leaves them before a bulk operation.
-- name: bench_analyze_jobs
analyze jobs;

-- Run by tenantlab.bench (wake_transactions) as admin, from another database: the transactions
-- the sessions of database `name` have ended so far (committed and rolled back).
-- name: bench_db_transactions
select xact_commit + xact_rollback from pg_stat_database where datname = %(name)s;

-- Run by tenantlab.bench (claim_after_bulk) on the running worker's connection: psycopg's name
-- for the worker's prepared claim (its text with $1, $2 ... for the parameters).
-- name: bench_prepared_name
select name from pg_prepared_statements where statement = %(statement)s;

-- Run by tenantlab.bench (claim_after_bulk) on the running worker's connection, in autocommit:
-- the worker's own prepared claim, on the plan PostgreSQL keeps for it (a real claim, committed:
-- its job stays leased), with the buffers it read. Composed with psycopg.sql: {name} the
-- prepared statement, {args} its parameters.
-- name: bench_explain_prepared
explain (analyze, buffers, format json) execute {name}({args});
