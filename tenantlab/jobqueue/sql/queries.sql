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

-- ---------------------------------------------------------------------------------------------
-- Fair claims (`--fair`): the same claim as claim_leased (attempt counted, lease set, the same
-- columns back, so execute, the fence, the heartbeat and the reaper are unchanged), with
-- another choice of job. Each is one statement, committed before any work starts.

-- Run by Leased.claim with fair='round-robin': the oldest eligible job of the tenant served
-- least recently (never served first), one job per tenant for a batch; the tenants' turns are
-- moved in the same statement. Tenants with work are listed by a skip scan over
-- jobs_claimable_by_tenant (one descent each: a tenant's backlog costs nothing), put in turn
-- order, then probed in that order for an unlocked eligible job until the batch is full: only
-- the jobs taken are locked. Guarantee: while a tenant has an eligible job, each other tenant
-- is served at most once before it, plus the claims already in flight (one per other worker).
-- Not given: weights; two workers claiming at the same moment may serve the same tenant; a
-- long job still holds its worker. Cost: one descent per tenant with work, per claim.
-- name: claim_round_robin
with recursive tenants as (
  (select tenant_id from jobs
    where status in ('queued', 'running')
    order by tenant_id limit 1)
  union all
  select (select j.tenant_id from jobs j
           where j.status in ('queued', 'running') and j.tenant_id > tenants.tenant_id
           order by j.tenant_id limit 1)
    from tenants
   where tenants.tenant_id is not null
), picked as (
  -- Ordered in a subquery of its own, then probed lazily: the probe (and its row lock) runs
  -- for the tenants walked, never for all of them.
  select job.id, turn.tenant_id
    from (select tenants.tenant_id from tenants
            left join tenant_turns using (tenant_id)
           where tenants.tenant_id is not null
           order by tenant_turns.last_served nulls first, tenants.tenant_id) as turn
   cross join lateral (
         select id from jobs
          where jobs.tenant_id = turn.tenant_id
            and status in ('queued', 'running')
            and (status = 'queued' or locked_until < clock_timestamp())
            and attempts < max_attempts
            and (run_after is null or run_after <= clock_timestamp())
          order by id limit 1
          for update skip locked) as job
   limit %(batch)s
), moved as (
  -- Skip locked: a turn locked now is being moved by a claim that serves the same tenant at
  -- this moment. Waiting for it would line every worker up behind one busy tenant's turn.
  update tenant_turns set last_served = clock_timestamp()
   where tenant_id in (select tenant_id from tenant_turns
                        where tenant_id in (select tenant_id from picked)
                        for no key update skip locked)
), first_turn as (
  -- Only tenants without a turn yet (in this snapshot): an existing turn is never waited on.
  insert into tenant_turns (tenant_id, last_served)
  select tenant_id, clock_timestamp() from picked
   where not exists (select from tenant_turns t where t.tenant_id = picked.tenant_id)
   order by tenant_id
  on conflict (tenant_id) do nothing
)
update jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id in (select id from picked)
returning id, tenant_id, attempts as attempt, kind, payload;

-- Run by Leased.claim with fair='limit=N': the FIFO claim, skipping the jobs of tenants that
-- already run N jobs (running, lease not expired: a dead worker's job stops counting when its
-- lease does). The busy tenants come from jobs_running_lease (one row per running job).
-- A soft limit: two claims at the same moment can both see N-1 and both take one (N+1), and a
-- batch can take several jobs of a tenant below N. It helps only with more workers than N; the
-- walk passes the busy tenants' eligible jobs (the noisy backlog) before it finds another's.
-- name: claim_limit
update jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id in (select id from jobs
               where status in ('queued', 'running')
                 and (status = 'queued' or locked_until < clock_timestamp())
                 and attempts < max_attempts
                 and (run_after is null or run_after <= clock_timestamp())
                 and tenant_id not in (select tenant_id from jobs
                                        where status = 'running'
                                          and locked_until >= clock_timestamp()
                                        group by tenant_id
                                       having count(*) >= %(limit)s)
               order by id limit %(batch)s
               for update skip locked)
returning id, tenant_id, attempts as attempt, kind, payload;
