-- The lab's naive designs and traps, never in production (tenantlab/queue.py): the article's
-- single-transaction queue, the lease-only queue's unfenced finish, and the poison pill. The
-- corrected worker's queries are in tenantlab/jobqueue/sql/queries.sql.

-- Run by SingleTransaction inside its one transaction: the row lock is the claim. The attempt
-- is counted here too, and rolls back with the work when the work fails (finding poison).
-- name: claim_single
update jobs set attempts = attempts + 1
where id = (select id from jobs
            where status = 'queued'
            order by id limit 1
            for update skip locked)
returning id, tenant_id, attempts as attempt, kind, payload;

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
  update job_runs set finished = clock_timestamp()
   where id = %(run)s and job_id in (select id from done)
)
select count(*) as finished from done;

-- Run by the job kind "fail" (tenantlab/kinds.py): the article's poison pill.
-- name: poison
select 1/0;
