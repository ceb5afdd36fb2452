-- The lease's companions (tenantlab/heartbeat.py, tenantlab/queue.py's Leased): the heartbeat
-- that keeps a live attempt's lease fresh, and the unfenced finish the overrun experiment needs
-- to show what the fence prevents. Job ids, attempts and leases are always bound parameters.

-- Run by tenantlab.heartbeat.Heartbeat on its own connection every interval while the work runs:
-- extends the lease only for the attempt this worker claimed. No row back = another attempt
-- owns the job (or it finished): the heartbeat stops.
-- name: heartbeat_if_owner
update jobs
   set locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = %(id)s and attempts = %(attempt)s and status = 'running'
returning locked_until;

-- Run by Leased(fence=False) as the last statement of the work's transaction: the naive finish
-- of a lease-only queue, which trusts the lease and checks nothing. A worker that outlived its
-- lease overwrites the job another attempt now owns (finding overrun, variant lease_only).
-- name: complete_unfenced
with done as (
  update jobs set status = 'done', locked_until = null, last_error = null
   where id = %(id)s
  returning id
), run as (
  update job_runs set finished = clock_timestamp()
   where id = %(run)s and job_id in (select id from done)
)
select count(*) as finished from done;

-- Run by the overrun experiment: every execution the database still shows for one job, with
-- whether it finished (a fenced execution's row rolled back with its work).
-- name: job_runs_of
select worker, attempt, started, finished
  from job_runs
 where job_id = %(id)s
 order by id;
