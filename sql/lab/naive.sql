-- The lab's naive designs and traps, never in production (tenantlab/queue.py): the article's
-- single-transaction queue, the lease-only queue's unfenced finish, and the poison pill. The
-- corrected worker's queries are in jobqueue/src/jobqueue/sql/queries.sql.

-- Run by SingleTransaction inside its one transaction: the row lock is the claim. The attempt
-- is counted here too, and rolls back with the work when the work fails (finding poison).
-- name: claim_single
update jobs set attempts = attempts + 1
where id = (select id from jobs
            where status = 'queued'
            order by id limit 1
            for update skip locked)
returning id, tenant_id, attempts as attempt, kind, payload;

-- Run by SingleTransaction right after its claim, in the same transaction: the tenant (local
-- form) and the execution's job_runs row, written at the start (the transaction holds an xid
-- from its claim anyway).
-- name: start_run_single
with run as (
  insert into job_runs (job_id, worker, attempt, started)
  values (%(id)s, %(worker)s, %(attempt)s, clock_timestamp())
  returning id
)
select run.id, set_config('app.tenant', %(tenant)s, true) from run;

-- Run by SingleTransaction as the last statement of its transaction.
-- name: finish_single
with run as (update job_runs set finished = clock_timestamp() where id = %(run)s)
update jobs set status = 'done', last_error = null, finished = clock_timestamp()
 where id = %(id)s;

-- Run by SingleTransaction(handle_errors=True) in a NEW transaction after the work's rolled
-- back: counts the attempt the rollback took away; dead at max_attempts.
-- name: fail_single
update jobs
   set attempts = attempts + 1,
       status = case when attempts + 1 >= max_attempts then 'dead' else 'queued' end,
       finished = case when attempts + 1 >= max_attempts then clock_timestamp() end,
       last_error = %(error)s
 where id = %(id)s and status = 'queued'
returning status, attempts;

-- Run by Leased(fence=False) as the last statement of the work's transaction: the naive finish
-- of a lease-only queue, which trusts the lease and checks nothing. A worker that outlived its
-- lease overwrites the job another attempt now owns (finding overrun, variant lease_only).
-- name: complete_unfenced
with done as (
  update jobs set status = 'done', locked_until = null, last_error = null,
                  finished = clock_timestamp()
   where id = %(id)s
  returning id
), run as (
  insert into job_runs (job_id, worker, attempt, started, finished)
  select id, %(worker)s, %(attempt)s, coalesce(%(started)s::timestamptz, clock_timestamp()),
         clock_timestamp()
    from done
  returning id
)
select count(*) as finished, (select id from run) as run from done;

-- Run by Leased(fence=False) to start the work: the tenant, and nothing checked (the naive
-- queue trusts its lease).
-- name: start_unfenced
select clock_timestamp() as started, set_config('app.tenant', %(tenant)s, true);

-- Run by the job kind "fail" (tenantlab/kinds.py): the article's poison pill.
-- name: poison
select 1/0;
