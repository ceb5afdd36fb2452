-- The lab's jobs: the production tables (jobqueue/src/jobqueue/migrations, schema jobqueue, built
-- first into the template; the lab's databases have it on their search_path, so the lab names
-- them bare) plus what the workshop adds. Still not under the tenant policy: a worker that
-- serves every tenant must see every job before it knows which tenant to become (finding
-- rls-jobs shows what happens otherwise, in its own database).
--
-- `seconds` is the demo kinds' work duration, kept in the payload like any job's arguments and
-- shown as a column of its own; demo kinds run for the lab's 100 tenants only.
alter table jobs
  alter column kind set default 'count',
  add column seconds double precision not null
    generated always as (coalesce((payload ->> 'seconds')::float8, 0)) stored,
  add constraint seconds_not_negative check (seconds >= 0),
  add constraint jobs_tenant_id_fkey foreign key (tenant_id) references tenants;

grant usage on schema jobqueue to tenantlab_worker;
grant select, insert, update, delete on jobs to tenantlab_worker;
grant select, insert, update, delete on job_runs to tenantlab_worker;
grant select, update on claimable to tenantlab_worker;
grant select on jobqueue.migrations to tenantlab_worker;
-- The round-robin claim moves the tenants' turns (finding noisy-neighbour).
grant select, insert, update on tenant_turns to tenantlab_worker;
-- Workers say they are alive, and which kinds they serve (`stats`: kinds without a worker).
grant select, insert, update, delete on jobqueue.workers to tenantlab_worker;
-- Periodic jobs move their schedule's last slot (jobqueue.periodic).
grant select, insert, update on jobqueue.periodic to tenantlab_worker;
-- Bulk enqueues and retries analyze the jobs afterwards (jobqueue migration 0006).
grant execute on function jobqueue.analyze_after_bulk(bigint) to tenantlab_worker;

-- What a demo job wrote in its own transaction (payload `"write": true`): a handler that writes
-- takes a transaction id at that write and holds it until its finish commits (findings vacuum,
-- vanish); one that does not write holds none.
create table job_writes (
  id       bigint generated always as identity primary key,
  job_id   bigint not null,
  attempt  int not null,
  tenant_id int not null,
  at       timestamptz not null default clock_timestamp()
);
grant select, insert on job_writes to tenantlab_worker;

-- Run by the demo kinds whose payload says `"write": true`, first thing in their work.
-- name: demo_write
insert into job_writes (job_id, attempt, tenant_id) values (%(id)s, %(attempt)s, %(tenant)s);

-- Run by tenantlab enqueue and the experiments (tenantlab.queue.enqueue): n demo jobs of one
-- kind; no tenant spreads them over tenants 1..100 in turn. Notifies like the production
-- enqueue, so listening workers wake at once.
-- name: enqueue_demo
with job as (
  insert into jobs (tenant_id, kind, payload, max_attempts)
  select coalesce(%(tenant)s::int, 1 + (g - 1) %% 100), %(kind)s,
         jsonb_build_object('seconds', %(seconds)s::float8)
           || case when %(write)s then jsonb_build_object('write', true) else '{}' end,
         %(max_attempts)s
  from generate_series(1, %(count)s::int) as g
  returning id
)
select id, pg_notify('jobqueue', '') from job order by id;

-- Run by the crash experiment, tests and notebooks: which jobs the leased claim could take now
-- (the production claim's own view, without taking anything).
-- name: eligible_leased
select id from claimable order by claimable_at, id;

-- Run by experiments, tests and notebooks: the state of every job; `runs` counts its completed
-- executions (outcome done: failed and fenced attempts have rows of their own).
-- name: job_states
select j.id, j.tenant_id, j.kind, j.status, j.attempts, j.max_attempts,
       j.locked_until, j.locked_until < clock_timestamp() as lease_expired,
       j.run_after, j.last_error,
       (select count(*) from job_runs r where r.job_id = j.id and r.outcome = 'done') as runs
from jobs j
order by j.id;

-- Run by the overrun experiment: every execution of one job that the database kept as done,
-- with whether it finished (a fenced execution's work rolled back; its own row, outcome
-- 'fenced', is not a completion).
-- name: job_runs_of
select worker, attempt, started, finished
  from job_runs
 where job_id = %(id)s and outcome = 'done'
 order by id;

-- Run by the rls-jobs experiment and notebook 08: how many jobs this session can see.
-- name: count_jobs
select count(*) from jobs;

-- Run by the experiments as admin between variants: an empty queue, ids from 1 again.
-- name: reset_queue
truncate jobs, job_runs, tenant_turns, job_writes restart identity;

-- Run by the rls-jobs experiment as admin in its own scratch database: the trap, the invoices'
-- tenant policy on the jobs table too.
-- name: jobs_tenant_policy
alter table jobs enable row level security;
alter table jobs force row level security;
create policy tenant_isolation on jobs
  using (tenant_id = nullif(current_setting('app.tenant', true), '')::int);

-- Run by the rls-jobs experiment as admin: the fix, the jobs table out of the tenant policy.
-- name: jobs_drop_tenant_policy
drop policy tenant_isolation on jobs;
alter table jobs no force row level security;
alter table jobs disable row level security;
