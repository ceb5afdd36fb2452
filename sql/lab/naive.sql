-- The queue's queries, for both designs (tenantlab/queue.py) and the reaper (tenantlab/reaper.py).
-- The single-transaction design claims with a row lock and finishes in the same transaction;
-- the leased design commits its claim first (attempt counted, lease set) and fences its finish.
-- Tenant ids, job ids, attempts and durations are always bound parameters.

-- Run by tenantlab enqueue and the experiments: n jobs of one kind; no tenant spreads them
-- over tenants 1..100 in turn.
-- name: enqueue
insert into jobs (tenant_id, kind, seconds, max_attempts)
select coalesce(%(tenant)s::int, 1 + (g - 1) %% 100), %(kind)s, %(seconds)s, %(max_attempts)s
from generate_series(1, %(count)s::int) as g
returning id;

-- Run by both designs at the start of every execution, inside the work's transaction, so a
-- rollback takes the row with it (the article counts executions this way).
-- name: start_run
insert into job_runs (job_id, worker, attempt) values (%(id)s, %(worker)s, %(attempt)s)
returning id;

-- Run by SingleTransaction inside its one transaction: the row lock is the claim. The attempt
-- is counted here too, and rolls back with the work when the work fails (finding poison).
-- name: claim_single
update jobs set attempts = attempts + 1
where id = (select id from jobs
            where status = 'queued'
            order by id limit 1
            for update skip locked)
returning id, tenant_id, attempts as attempt, kind, seconds;

-- Run by SingleTransaction as the last statement of its transaction.
-- name: finish_single
with run as (update job_runs set finished = clock_timestamp() where id = %(run)s)
update jobs set status = 'done', last_error = null where id = %(id)s;

-- Run by SingleTransaction(handle_errors=True) in a NEW transaction after the work's rolled
-- back: counts the attempt the rollback took away; dead at max_attempts.
-- name: fail_single
update jobs
   set attempts = attempts + 1,
       status = case when attempts + 1 >= max_attempts then 'dead' else 'queued' end,
       last_error = %(error)s
 where id = %(id)s and status = 'queued'
returning status, attempts;

-- Run by Leased in a transaction of its own (committed before any work): the article's claim,
-- with the lease as a parameter and backoff respected. Counts the attempt before the work.
-- name: claim_leased
update jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = (select id from jobs
              where (status = 'queued'
                     or (status = 'running' and locked_until < clock_timestamp()))
                and attempts < max_attempts
                and (run_after is null or run_after <= clock_timestamp())
              order by id limit 1
              for update skip locked)
returning id, tenant_id, attempts as attempt, kind, seconds;

-- Run by the crash experiment and notebooks: which jobs the leased claim could take now (the
-- claim's WHERE clause, without taking anything).
-- name: eligible_leased
select id from jobs
 where (status = 'queued' or (status = 'running' and locked_until < clock_timestamp()))
   and attempts < max_attempts
   and (run_after is null or run_after <= clock_timestamp())
 order by id;

-- Run by Leased as the last statement of the work's transaction: only the attempt that was
-- claimed may finish. Returns how many jobs it finished (0 = fenced out: roll back).
-- name: complete_if_owner
with done as (
  update jobs set status = 'done', locked_until = null, last_error = null
   where id = %(id)s and attempts = %(attempt)s and status = 'running'
  returning id
), run as (
  update job_runs set finished = clock_timestamp()
   where id = %(run)s and job_id in (select id from done)
)
select count(*) as finished from done;

-- Run by Leased in a new transaction after the work failed: fenced like the completion.
-- Queued again after a backoff that doubles with each attempt (times 0.75..1.25 of jitter,
-- capped), or dead at max_attempts. No row back = fenced out.
-- name: fail_if_owner
update jobs
   set status = case when attempts >= max_attempts then 'dead' else 'queued' end,
       locked_until = null,
       last_error = %(error)s,
       run_after = case when %(backoff)s::float8 > 0 then clock_timestamp() + make_interval(
         secs => least(%(backoff_cap)s::float8, %(backoff)s::float8 * power(2, attempts - 1))
                 * (0.75 + random() * 0.5)) end
 where id = %(id)s and attempts = %(attempt)s and status = 'running'
returning status, attempts, run_after;

-- Run by tenantlab.reaper.Reaper: jobs whose lease expired. Exhausted ones become dead (the
-- article's proposal); with requeue, the others go back to queued. A live worker that merely
-- overran its lease is fenced out by this (see the reaper's docstring).
-- name: reap_expired
update jobs
   set status = case when attempts >= max_attempts then 'dead' else 'queued' end,
       locked_until = null,
       last_error = 'reaped: lease expired at attempt ' || attempts
 where id in (select id from jobs
               where status = 'running'
                 and locked_until < clock_timestamp() - make_interval(secs => %(grace)s)
                 and (attempts >= max_attempts or %(requeue)s)
               order by id limit %(batch)s
               for update skip locked)
returning id, tenant_id, attempts, status;

-- Run by experiments, tests and notebooks: the state of every job.
-- name: job_states
select j.id, j.tenant_id, j.kind, j.status, j.attempts, j.max_attempts,
       j.locked_until, j.locked_until < clock_timestamp() as lease_expired,
       j.run_after, j.last_error,
       (select count(*) from job_runs r where r.job_id = j.id) as runs
from jobs j
order by j.id;

-- Run by the rls-jobs experiment and notebook 08: how many jobs this session can see.
-- name: count_jobs
select count(*) from jobs;

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

-- Run by the job kind "fail" (tenantlab/kinds.py): the article's poison pill.
-- name: poison
select 1/0;

-- Run by the experiments as admin between variants: an empty queue, ids from 1 again.
-- name: reset_queue
truncate jobs, job_runs restart identity;

-- Run by tenantlab.bench: the server settings that decide what a commit costs.
-- name: bench_setting
select current_setting(%(name)s);

-- Run by Leased.claim before the claim, in the claim's transaction: commit without waiting
-- for the WAL flush; the work's (synchronous) commit flushes the claim too.
-- name: claim_commit_async
select set_config('synchronous_commit', 'off', true);
