-- Notebook 06's exported worker: an application's own table its long job never touches, whose
-- dead rows VACUUM is asked to remove. No schema here: the table is made in the vacuum
-- experiment's scratch database only, so no other lesson sees it. (The writing handler writes
-- to the lab's job_writes, sql/lab/jobs.sql.)

-- Run by tenantlab.experiments.vacuum (as admin) before each exported-worker variant.
-- Autovacuum off: only the experiment's own VACUUM may remove the dead rows it counts.
-- name: vacuum_create_churn
create table if not exists churn (id int primary key, n int not null default 0)
  with (autovacuum_enabled = false);
truncate churn;

-- Run by tenantlab.experiments.vacuum (as admin): n live rows in churn, none dead yet.
-- name: vacuum_churn_fill
insert into churn (id) select generate_series(1, %(n)s::int);

-- Run by tenantlab.experiments.vacuum (as admin) while the long job runs: one dead row version
-- per row of churn, committed at once.
-- name: vacuum_churn_update
update churn set n = n + 1;

-- Run by tenantlab.experiments.vacuum (as admin, autocommit): its INFO lines are parsed.
-- name: vacuum_verbose_churn
vacuum (verbose) churn;

-- Run by tenantlab.experiments.vacuum: the exported worker's session (it names itself
-- "jobqueue NAME"): what it holds, and the last statement it ran.
-- name: vacuum_worker_session
select pid, state, backend_xid::text as backend_xid, backend_xmin::text as backend_xmin,
       query, state_change
from pg_stat_activity
where application_name = %(app)s and datname = current_database();

-- Run by tenantlab.experiments.vacuum after the exported worker exits: how its job ended.
-- name: vacuum_job_status
select status from jobs where id = %(id)s;
