-- The worker's queries (tenantlab/jobqueue). Job ids, tenants, attempts, leases and durations
-- are always bound parameters. A guard is in the WHERE clause and in the name: `_if_owner`
-- queries act only for the attempt this worker claimed, and say by their row count whether
-- they did (no row = fenced out: another attempt owns the job now).

-- Run by jobqueue.enqueue, in the caller's transaction: one job, any kind (the worker checks
-- at run time that it has a handler). The notification goes out when that transaction
-- commits (never for a rollback), and wakes the idle workers listening on `jobqueue`.
-- name: enqueue
with job as (
  insert into jobs (tenant_id, kind, payload, max_attempts, run_after)
  values (%(tenant)s, %(kind)s, %(payload)s, %(max_attempts)s, %(run_after)s)
  returning id
)
select id, pg_notify('jobqueue', '') from job;

-- Run by an idle worker on its own connection: wake on every enqueue (the poll is the fallback).
-- name: listen
listen jobqueue;

-- Run by Leased.claim as a statement of its own, committed (durably) before any work starts:
-- the oldest eligible job, its attempt counted and its lease set in the same statement. A
-- crash from here on cannot undo the count. Reads the jobs_claimable index only.
-- name: claim_leased
update jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id in (select id from jobs
               where status in ('queued', 'running')
                 and (status = 'queued' or locked_until < clock_timestamp())
                 and attempts < max_attempts
                 and (run_after is null or run_after <= clock_timestamp())
               order by id limit %(batch)s
               for update skip locked)
returning id, tenant_id, attempts as attempt, kind, payload;

-- Run by Leased.claim with lossy_claim=True: the same claim, committed without waiting for
-- its WAL flush. Faster; but a server crash right after it can lose the count, and the same
-- attempt number is then handed out twice (the fence cannot tell those executions apart).
-- name: claim_leased_lossy
update jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
  from (select set_config('synchronous_commit', 'off', true)) as lossy
 where id in (select id from jobs
               where status in ('queued', 'running')
                 and (status = 'queued' or locked_until < clock_timestamp())
                 and attempts < max_attempts
                 and (run_after is null or run_after <= clock_timestamp())
               order by id limit %(batch)s
               for update skip locked)
returning id, tenant_id, attempts as attempt, kind, payload;

-- Run by Leased.execute as the first statement of the work's transaction: the tenant in its
-- local form (it ends with the transaction, whatever the outcome) and the execution's job_runs
-- row (a rollback takes it with it), in one round trip.
-- name: start_run
with run as (
  insert into job_runs (job_id, worker, attempt) values (%(id)s, %(worker)s, %(attempt)s)
  returning id
)
select run.id, set_config('app.tenant', %(tenant)s, true) from run;

-- Run by handlers that need the tenant set again (or set by hand): the local form only.
-- name: tenant_set_local
select set_config('app.tenant', %(tenant)s, true);

-- Run by Leased.execute as the last statement of the work's transaction: only the attempt that
-- was claimed may finish. Returns how many jobs it finished (0 = fenced out: roll back).
-- name: complete_if_owner
with done as (
  update jobs set status = 'done', locked_until = null, last_error = null,
                  finished = clock_timestamp()
   where id = %(id)s and attempts = %(attempt)s and status = 'running'
  returning id
), run as (
  update job_runs set finished = clock_timestamp()
   where id = %(run)s and job_id in (select id from done)
)
select count(*) as finished from done;

-- Run by Leased.execute instead of complete_if_owner when the worker goes on: the fenced
-- finish of this job and the claim of the next ones, committed together. One durable commit
-- per job instead of two, and the guarantees hold: the next attempts are counted (and their
-- leases set) when this commits, before their work starts; a fenced finish rolls the claim
-- back with everything else. One row per job claimed (or one with nulls): `finished` = 0 is
-- fenced out (roll back).
-- name: complete_if_owner_and_claim
with done as (
  update jobs set status = 'done', locked_until = null, last_error = null,
                  finished = clock_timestamp()
   where id = %(id)s and attempts = %(attempt)s and status = 'running'
  returning id
), run as (
  update job_runs set finished = clock_timestamp()
   where id = %(run)s and job_id in (select id from done)
), next as (
  update jobs
     set status = 'running', attempts = attempts + 1,
         locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
   where id in (select id from jobs
                 where status in ('queued', 'running')
                   and (status = 'queued' or locked_until < clock_timestamp())
                   and attempts < max_attempts
                   and (run_after is null or run_after <= clock_timestamp())
                   and id <> %(id)s
                 order by id limit %(batch)s
                 for update skip locked)
  returning id, tenant_id, attempts as attempt, kind, payload
)
select (select count(*) from done) as finished,
       next.id, next.tenant_id, next.attempt, next.kind, next.payload
  from (select) as one left join next on true;

-- Run by Leased.fail in a new transaction after the work failed: fenced like the completion.
-- Queued again after a backoff that doubles with each attempt (times 0.75..1.25 of jitter,
-- capped), or dead at max_attempts. No row back = fenced out.
-- name: fail_if_owner
update jobs
   set status = case when attempts >= max_attempts then 'dead' else 'queued' end,
       locked_until = null,
       last_error = %(error)s,
       finished = case when attempts >= max_attempts then clock_timestamp() end,
       run_after = case when %(backoff)s::float8 > 0 then clock_timestamp() + make_interval(
         secs => least(%(backoff_cap)s::float8, %(backoff)s::float8 * power(2, attempts - 1))
                 * (0.75 + random() * 0.5)) end
 where id = %(id)s and attempts = %(attempt)s and status = 'running'
returning status, attempts, run_after;

-- Run by the heartbeat on its own connection: extends the leases of every job this worker
-- holds, each only for the attempt it claimed. The rows back are the leases still owned; a
-- job missing from them was lost (another attempt owns it, or it finished).
-- name: heartbeat_if_owner_many
update jobs
   set locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
  from unnest(%(ids)s::bigint[], %(attempts)s::int[]) as held(id, attempt)
 where jobs.id = held.id and jobs.attempts = held.attempt and jobs.status = 'running'
returning jobs.id, jobs.locked_until;

-- Run by the heartbeat for a single job: extends its lease only for the attempt it claimed.
-- name: heartbeat_if_owner
update jobs
   set locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = %(id)s and attempts = %(attempt)s and status = 'running'
returning locked_until;

-- Run by the reaper: jobs whose lease expired. Exhausted ones become dead; with requeue, the
-- others go back to queued. A live worker that merely overran its lease is fenced out by this
-- (see the reaper's docstring). Reads the jobs_running_lease index only.
-- name: reap_expired
update jobs
   set status = case when attempts >= max_attempts then 'dead' else 'queued' end,
       locked_until = null,
       finished = case when attempts >= max_attempts then clock_timestamp() end,
       last_error = 'reaped: lease expired at attempt ' || attempts
 where id in (select id from jobs
               where status = 'running'
                 and locked_until < clock_timestamp() - make_interval(secs => %(grace)s)
                 and (attempts >= max_attempts or %(requeue)s)
               order by locked_until limit %(batch)s
               for update skip locked)
returning id, tenant_id, attempts, status;

-- Run by prune: delete one batch of jobs finished (done or dead) more than `age` seconds ago,
-- oldest first. Walks the primary key from the oldest job: a batch stops early.
-- name: prune_jobs
delete from jobs
 where id in (select id from jobs
               where status in ('done', 'dead')
                 and coalesce(finished, created) < clock_timestamp() - make_interval(secs => %(age)s)
               order by id limit %(batch)s
               for update skip locked)
returning id;

-- Run by prune: delete one batch of job_runs rows started more than `age` seconds ago.
-- name: prune_runs
delete from job_runs
 where id in (select id from job_runs
               where started < clock_timestamp() - make_interval(secs => %(age)s)
               order by id limit %(batch)s)
returning id;

-- Run by jobqueue.counts (monitoring): how many jobs are in each state.
-- name: job_counts
select status, count(*) as jobs from jobs group by status order by status;

-- Run by apply_schema before schema.sql, in the same transaction: workers started together
-- on a fresh database set it up one at a time (the rest find it done).
-- name: schema_lock
select pg_advisory_xact_lock(hashtext('jobqueue schema'));
