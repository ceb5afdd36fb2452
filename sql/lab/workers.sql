-- Many workers on one queue (findings `workers` and `noisy-neighbour`, notebook 11): the
-- lab-only claim that shows why the production claim skips locked rows, and what the
-- experiments read while workers drain the queue. Queries only.

-- Run by the workers experiment for contrast, never by the production worker: the leased
-- claim with a plain FOR UPDATE. Every worker wants the oldest job, so they queue on its row
-- lock; when the holder commits, the next one re-reads the row, finds it taken, and queues on
-- the next: one lock queue, the claims served one at a time.
-- name: claim_plain
update jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id in (select id from claimable
               where kind = any(%(kinds)s::text[])
               order by claimable_at, id limit %(batch)s
               for update)
returning id, tenant_id, attempts as attempt, kind, payload;

-- Run by the workers experiment before a plain FOR UPDATE round with two workers or more: the
-- job every claim wants first, locked until the sampler has seen a claim queue on it, so that
-- the round's claims line up whatever the machine's scheduling (a fast drain cannot slip
-- between two samples).
-- name: hold_first_claimable
select id from claimable
 where kind = any(%(kinds)s::text[])
 order by claimable_at, id limit 1
   for update;

-- Run by the workers experiment as admin every few milliseconds: what the workers' server
-- sessions are doing now. `RowLock` = queued behind another transaction's row lock; `Lock` =
-- another heavyweight lock (extending a table, say); `CPU` = running, waiting on nothing;
-- `Client` = waiting for the worker process; `IO` (the WAL flush at commit), `LWLock` = the server.
-- For a session waiting on a lock, which statement waits (`waiter`) and on which (`blocker`,
-- the statement of the session pg_blocking_pids names): `claim` (a claim: `for update`),
-- `finish` (the fenced finish with its job_runs row), `other`; `gone` when the blocker let go
-- between the two reads. pg_blocking_pids runs only for the waiting sessions.
-- name: worker_sessions
with sessions as (
  select pid, query,
         case when wait_event_type = 'Lock' and wait_event in ('transactionid', 'tuple')
              then 'RowLock'
              else coalesce(wait_event_type, case when state = 'active' then 'CPU' else 'idle' end)
         end as what
    from pg_stat_activity
   where datname = current_database() and application_name like %(like)s
), kinds as (
  select s.what,
         case when s.what in ('RowLock', 'Lock') then
           case when s.query ilike '%%for update%%' then 'claim'
                when s.query ilike '%%job_runs%%' then 'finish' else 'other' end
         end as waiter,
         case when s.what in ('RowLock', 'Lock') then
           coalesce((select string_agg(distinct
                              case when b.query ilike '%%for update%%' then 'claim'
                                   when b.query ilike '%%job_runs%%' then 'finish'
                                   else 'other' end, '+')
                       from pg_stat_activity b where b.pid = any(pg_blocking_pids(s.pid))),
                    'gone')
         end as blocker
    from sessions s
)
select what, waiter, blocker, count(*) as sessions
  from kinds
 group by 1, 2, 3;

-- Run by both experiments at the end: every completed execution a job had (job_runs, outcome
-- done), so a job run twice shows up, whatever the jobs table says.
-- name: run_counts
select count(*) as runs, count(distinct job_id) as jobs_run,
       count(*) - count(distinct job_id) as duplicates
  from job_runs
 where outcome = 'done';

-- Run by the noisy-neighbour experiment while workers drain: per group (the noisy tenant, the
-- small ones), the jobs still queued and how long the oldest of them has waited so far.
-- name: backlog_by_group
select tenant_id = %(noisy)s as noisy,
       count(*) filter (where status = 'queued') as backlog,
       coalesce(extract(epoch from clock_timestamp()
                        - min(created) filter (where status = 'queued')), 0)::float8 as oldest_wait_s,
       count(*) filter (where status in ('done', 'dead')) as finished,
       count(*) as jobs
  from jobs
 group by 1;

-- Run by the noisy-neighbour experiment right after it queued everything in one transaction:
-- the server's clock at the commit, from when those jobs could be claimed.
-- name: server_clock
select extract(epoch from clock_timestamp())::float8 as now;

-- Run by the noisy-neighbour experiment at the end: each job's enqueue, first start and
-- finish (epoch seconds, server clock) and how many executions it had.
-- name: job_waits
with runs as (
  select job_id, min(started) as started, count(*) as runs from job_runs group by job_id
)
select j.id, j.tenant_id, j.status,
       extract(epoch from j.created)::float8 as created,
       extract(epoch from runs.started)::float8 as started,
       extract(epoch from j.finished)::float8 as finished,
       coalesce(runs.runs, 0) as runs
  from jobs j left join runs on runs.job_id = j.id
 order by j.id;

-- Run by the workers experiment's processes (experiments/_claimers.py): wait for the rounds.
-- name: claimers_listen
listen tenantlab_claimers;

-- Run by the workers experiment as admin: start a round (`go ROUND WORKERS CLAIM`) or `stop`.
-- name: claimers_notify
select pg_notify('tenantlab_claimers', %(payload)s);

-- Run by a claimer process when a round starts and ends: the sampler watches only the active.
-- name: claimer_name
select set_config('application_name', %(name)s, false);

-- Run by both experiments as admin right after the queue is filled: the planner's statistics
-- for a full queue, as autovacuum would soon give it. Without them (a freshly filled table)
-- every claim, FIFO or fair, sorts the whole queue instead of reading an index in order.
-- name: analyze_jobs
analyze jobs;

-- Run by the noisy-neighbour experiment before the burst: how many of its worker processes
-- are connected and idle after their first statement (LISTEN, then an empty claim), so a
-- notification wakes them. Startup never counts as a job's wait.
-- name: workers_waiting
select count(*) as waiting
  from pg_stat_activity
 where datname = current_database() and application_name like %(like)s
   and state = 'idle' and query <> '';

-- Run by the workers experiment's re-check demonstration, never by a worker: the production
-- claim (FOR UPDATE SKIP LOCKED) that, after its snapshot and before it locks a row, waits for
-- an advisory lock the experiment holds. A job claimed and committed by another worker
-- meanwhile is still queued in this snapshot: the claim locks the job's newest version to
-- re-check it, finds it taken, skips it, and keeps that lock until it commits. The job's finish
-- waits for that commit.
-- name: claim_skip_held
update jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = any(array(select id from claimable
                       where kind = any(%(kinds)s::text[])
                         and (select pg_advisory_xact_lock(%(key)s)) is not null
                       order by claimable_at, id limit 1
                       for update skip locked))
returning id;

-- Run by the re-check demonstration as admin: hold, and release, the lock that claim waits for.
-- name: recheck_hold
select pg_advisory_lock(%(key)s);

-- name: recheck_release
select pg_advisory_unlock(%(key)s);

-- Run by the re-check demonstration as admin: is this backend waiting on a lock, and whose?
-- name: lock_wait_of
select wait_event_type = 'Lock' as waiting, wait_event, pg_blocking_pids(pid) as blockers
  from pg_stat_activity
 where pid = %(pid)s;

-- Run by the re-check demonstration on worker A's connection: a bound on its finish's wait.
-- name: lock_timeout
select set_config('lock_timeout', %(timeout)s, false);
