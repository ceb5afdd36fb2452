-- Findings vanish and restart (notebook 10): what the server keeps for a worker that vanished,
-- and what a restart leaves behind. Queries only; the tables are the production ones.

-- Run by the vanish probe inside its network namespace: work done on the server, so that its
-- result travels back after the link was cut (what tcp_user_timeout bounds).
-- name: vanish_work_on_server
select pg_sleep(%(seconds)s::float8);

-- Run by the vanish experiment as admin: how the server sees the given backends now (a
-- missing pid has ended: the server noticed).
-- name: vanish_backends
select pid, state, backend_xid::text as backend_xid,
       extract(epoch from clock_timestamp() - state_change)::float8 as state_seconds,
       (select count(*) from pg_locks l where l.pid = a.pid and l.granted) as locks
  from pg_stat_activity a
 where pid = any(%(pids)s::int[]);

-- Run by the vanish experiment as admin every 20 ms while a silent session waits for its
-- idle_in_transaction_session_timeout: the server's clock, and the session's last statement
-- (state_change; null once the backend has ended). Both on the server's clock.
-- name: vanish_state_change
select extract(epoch from clock_timestamp())::float8 as now,
       (select extract(epoch from state_change)::float8
          from pg_stat_activity where pid = %(pid)s) as state_change;

-- Run by the vanish experiment as admin, inside a transaction it rolls back: can a migration
-- take the table the vanished job wrote to (job_writes) now? Fails with lock_not_available
-- while a vanished worker's transaction still holds its lock on the table.
-- name: vanish_try_migration_lock
lock table job_writes in access exclusive mode nowait;

-- Run by the throwaway cluster after it allowed the namespace's address in pg_hba.conf.
-- name: cluster_reload_conf
select pg_reload_conf();

-- Run by the restart experiment: every job's final state and how often it finished (a job
-- finished twice would have two finished job_runs rows).
-- name: restart_outcome
select count(*) as jobs,
       count(*) filter (where status = 'done') as done,
       count(*) filter (where status = 'dead') as dead,
       count(*) filter (where status not in ('done', 'dead')) as unfinished,
       (select count(*) from (select job_id from job_runs
                               where finished is not null and outcome = 'done'
                               group by job_id having count(*) > 1) as twice) as finished_twice,
       coalesce(sum(attempts), 0) as attempts
  from jobs;

-- Run by the restart experiment while the server comes back: jobs finished after a moment.
-- name: restart_finished_since
select count(*) from jobs where finished > to_timestamp(%(since)s::float8);

-- Run by the vanish experiment as admin: the backend of a worker's main connection, by its
-- application_name ('jobqueue A': the production loop names its sessions), in this database.
-- name: vanish_backend_of
select pid from pg_stat_activity
 where application_name = %(name)s and datname = current_database()
 order by backend_start limit 1;

-- Run by the restart experiment: what became of the job claimed right before a restart.
-- name: restart_job
select status, attempts from jobs where id = %(id)s;
