-- The worker's queries (jobqueue). Job ids, tenants, attempts, leases and durations
-- are always bound parameters; every table is named with its schema (`jobqueue.`), so nothing
-- depends on the session's search_path. A guard is in the WHERE clause and in the name:
-- `_if_owner` queries act only for the attempt this worker claimed, and say by their row count
-- whether they did (no row = fenced out: another attempt owns the job now).

-- Run by jobqueue.enqueue, in the caller's transaction: one job. The notification goes out when
-- that transaction commits (never for a rollback), and wakes the idle workers listening on
-- `jobqueue`.
-- name: enqueue
with job as (
  insert into jobqueue.jobs (tenant_id, kind, payload, max_attempts, run_after, queue, priority)
  values (%(tenant)s, %(kind)s, %(payload)s, %(max_attempts)s,
          coalesce(%(run_after)s::timestamptz,
                   clock_timestamp() + coalesce(%(delay)s::float8, 0) * interval '1 second'),
          %(queue)s, %(priority)s)
  returning id
)
select id, pg_notify('jobqueue', '') from job;

-- Run by jobqueue.enqueue with a unique key: the job, unless a live (queued or running) job has
-- the key; then that job's id. The partial unique index jobs_unique_key decides: an enqueue
-- of the same key by a transaction not committed yet is waited for. No row back: the job
-- that held the key finished, or the one that took it committed, while this ran (this
-- statement's snapshot sees neither): the caller runs it again.
-- name: enqueue_unique
with job as (
  insert into jobqueue.jobs (tenant_id, kind, payload, max_attempts, run_after, queue, priority,
                             unique_key)
  values (%(tenant)s, %(kind)s, %(payload)s, %(max_attempts)s,
          coalesce(%(run_after)s::timestamptz,
                   clock_timestamp() + coalesce(%(delay)s::float8, 0) * interval '1 second'),
          %(queue)s, %(priority)s, %(unique_key)s)
  on conflict (unique_key) where unique_key is not null and status in ('queued', 'running')
  do nothing
  returning id
)
select id, pg_notify('jobqueue', '') from job
union all
select id, null from jobqueue.jobs
 where unique_key = %(unique_key)s and status in ('queued', 'running')
   and not exists (select from job);

-- Run by jobqueue.enqueue_many: many jobs in one statement, from one JSON array (keys: t tenant,
-- k kind, p payload, m max_attempts, q queue, r priority, u unique_key, a run_after, d delay in
-- seconds; a key left out takes the column's default), one notification. The tenant is cast
-- from text to the installed tenant type. Ids come back in the array's order (the order the
-- rows are inserted in).
-- name: enqueue_many
with job as (
  insert into jobqueue.jobs (tenant_id, kind, payload, max_attempts, run_after, queue, priority)
  select j.t::jobqueue.tenant_id, j.k, coalesce(j.p, '{}'), coalesce(j.m, 3),
         coalesce(j.a, clock_timestamp() + coalesce(j.d, 0) * interval '1 second'),
         coalesce(j.q, 'default'), coalesce(j.r, 0)
    from json_to_recordset(%(jobs)s::json)
         as j(t text, k text, p jsonb, m int, q text, r smallint, u text, a timestamptz,
              d float8)
  returning id
), notified as (
  select pg_notify('jobqueue', '')
)
select job.id, null::text from job, notified;

-- Run by enqueue_many (and its async twin) after a batch of BULK_ANALYZE jobs or more, and by
-- retry_dead after as many: the statistics of jobqueue.jobs made afresh when the batch
-- outweighs what they know of (migration 0006), so that every session's kept plans are made
-- again with the table's real size, not a minute later by autoanalyze. In the caller's
-- transaction: its own new rows count.
-- name: analyze_after_bulk
select jobqueue.analyze_after_bulk(%(jobs)s);

-- Run by jobqueue.enqueue_many when a job has a unique key: the same insert, skipping each
-- job whose key a live job (or an earlier job of the same call) holds. Returns the rows
-- inserted with their keys; the caller looks the skipped keys up (unique_ids).
-- name: enqueue_many_unique
with job as (
  insert into jobqueue.jobs (tenant_id, kind, payload, max_attempts, run_after, queue, priority,
                             unique_key)
  select j.t::jobqueue.tenant_id, j.k, coalesce(j.p, '{}'), coalesce(j.m, 3),
         coalesce(j.a, clock_timestamp() + coalesce(j.d, 0) * interval '1 second'),
         coalesce(j.q, 'default'), coalesce(j.r, 0), j.u
    from json_to_recordset(%(jobs)s::json)
         as j(t text, k text, p jsonb, m int, q text, r smallint, u text, a timestamptz,
              d float8)
  on conflict (unique_key) where unique_key is not null and status in ('queued', 'running')
  do nothing
  returning id, unique_key
), notified as (
  select pg_notify('jobqueue', '')
)
select job.id, job.unique_key from job, notified;

-- Run by jobqueue.enqueue_many after enqueue_many_unique: the live jobs holding these keys.
-- name: unique_ids
select id, unique_key from jobqueue.jobs
 where unique_key = any(%(keys)s::text[]) and status in ('queued', 'running');

-- Run by a worker's periodic check (periodic.py) when a schedule's slot has come: the job of
-- that slot, only if this statement moves the schedule's last slot forward. Two workers at
-- once: the second waits for the first's row, then sees the slot taken (no job). A slot older
-- than the last one (a late worker) moves nothing. A schedule seen for the first time records
-- its slot and enqueues nothing: it starts at its next slot. Returns the job's id (null: none).
-- name: periodic_enqueue
with moved as (
  -- Never a slot the server's clock has not reached: a worker whose host clock runs fast
  -- must not record (nor enqueue) a future slot, which would hold the schedule back for
  -- every other worker until the server's clock caught up.
  insert into jobqueue.periodic as p (name, last_slot)
  select %(name)s, %(slot)s where %(slot)s::timestamptz <= clock_timestamp()
  on conflict (name) do update set last_slot = excluded.last_slot
   where p.last_slot < excluded.last_slot
  returning (xmax <> 0) as was_there
), job as (
  insert into jobqueue.jobs (tenant_id, kind, payload, max_attempts, queue, priority, unique_key)
  select %(tenant)s::text::jobqueue.tenant_id, %(kind)s, %(payload)s, %(max_attempts)s,
         %(queue)s, %(priority)s, %(unique_key)s
    from moved where moved.was_there
  returning id
)
select (select id from job), (select pg_notify('jobqueue', '') from job);

-- Run by a worker's periodic check (periodic.py) when a slot may have come, and once a minute:
-- the server's clock, which decides the slots (never the worker host's), in epoch seconds.
-- name: periodic_server_clock
select extract(epoch from clock_timestamp())::float8;

-- Run by a worker's preflight for each of its schedules: is the schedule's tenant a tenant id
-- of the installed type (an error if not)?
-- name: tenant_cast
select %(tenant)s::text::jobqueue.tenant_id;

-- Run by an idle worker on its own connection: wake on every enqueue (the poll is the fallback).
-- name: listen
listen jobqueue;

-- One wake-up per job, not one per idle worker (worker.py, Wake). Every idle worker that
-- listens on its own connection holds this session-level advisory lock, keyed by what it serves
-- (`serves`: its queues and kinds) and its backend pid, taken without waiting (no snapshot is
-- held while idle): the register of the idle workers, read back from pg_locks (readable by any
-- role; no table, no grant). Run when its session starts and when it goes idle again (in the
-- finish's transaction when that finish's claim found nothing). First column: the key of what it
-- serves, the group its wake-ups are handed on in. At a session's start (`announce`) it also
-- names itself the group's designee (-1: it claims right after anyway), so that the workers
-- started last agree on one designee instead of all answering the first enqueue.
-- name: idle_register
select hashtext(%(serves)s) as key,
       pg_try_advisory_lock(hashtext(%(serves)s), pg_backend_pid()) as registered,
       case when %(announce)s then pg_notify('jobqueue', concat_ws(' ', 'next',
         hashtext(%(serves)s), pg_backend_pid(), -1, 0)) end as announced;

-- Run in the transaction of the claim of a worker that was idle, when the claim took jobs: it is
-- idle no more (its lock freed), and it names the next idle worker of its group (one at random,
-- or 0: none) to whom the enqueues' wake-ups now go, on the enqueues' channel: 'next <key>
-- <pid> <wake-ups it had read before this claim> <whether claimable jobs remain>'. Jobs remain
-- (a burst): it names none, and every idle worker claims at once. Otherwise the one named
-- claims at once only when a wake-up came that this claim may not have seen (it counts them
-- too), else waits for the next enqueue; the others do nothing (no transaction). Sent at the
-- commit, with the claim.
-- name: idle_hand_on
select pg_advisory_unlock(hashtext(%(serves)s), pg_backend_pid()) as unregistered,
       pg_notify('jobqueue', concat_ws(' ', 'next', hashtext(%(serves)s),
         case when remain then 0 else
         coalesce((select l.pid from pg_locks l
                    where l.locktype = 'advisory' and l.objsubid = 2 and l.granted
                      and l.classid::int4 = hashtext(%(serves)s)
                      and l.database = (select oid from pg_database
                                         where datname = current_database())
                      and l.pid <> pg_backend_pid()
                    order by random() limit 1), 0) end,
         %(seen)s::int, remain::int))
  from (select exists (select from jobqueue.claimable
                        where queue = any(%(queues)s::text[])
                          and kind = any(%(kinds)s::text[])) as remain) as r;

-- Run by the worker and the reaper at each (re)connection, before the outage is over: a hot
-- standby (or read-only sessions) answers but takes no writes, so it is waited for as an outage.
-- name: server_writable
select pg_is_in_recovery() as standby,
       current_setting('transaction_read_only')::bool as read_only;

-- Run by Leased.claim as a statement of its own, committed (durably) before any work starts:
-- the first claimable jobs of the worker's kinds in its queue, highest priority first, then the
-- oldest; each attempt counted and its lease set in the same statement. A crash from here on
-- cannot undo the count. Reads the jobs_claimable index (queue, priority desc, claimable_at,
-- ...) through the view `claimable`, the one definition of what may be claimed. Every priority
-- is named (the list is the column's whole range, priority_in_range): the index scan takes
-- them in order, each from its start to its first job not due yet, so jobs scheduled or
-- backing off cost it nothing, in any priority, and an empty priority costs no more than a
-- step to the next one present. `id = any(array(...))` runs the choice once, first, and the
-- update by primary key: a plan that stays the same whatever the table's estimates (with `id
-- in (...)` the planner, misled by exhausted rows it cannot tell apart, re-planned every claim
-- at several times the cost). A worker serving one queue (the default) uses this claim; one
-- serving several, claim_leased_queues. Leased.claim_query writes the batch size in (a number,
-- not a parameter, in the four claim_leased statements): PostgreSQL costs a kept generic plan's
-- `limit $n` as a tenth of the rows, so with a large analyzed queue it planned every claim afresh.
-- name: claim_leased
update jobqueue.jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = any(array(select id from jobqueue.claimable
                       where queue = (%(queues)s::text[])[1]
                         and priority = any('{10,9,8,7,6,5,4,3,2,1,0,-1,-2,-3,-4,-5,-6,-7,-8,-9,-10}'::smallint[])
                         and kind = any(%(kinds)s::text[])
                       order by priority desc, claimable_at, id limit %(batch)s
                       for update skip locked))
returning id, tenant_id, attempts as attempt, kind, payload;

-- Run by Leased.claim with lossy_claim=True, only for a claim that is a transaction of its own:
-- the same claim, committed without waiting for its WAL flush. Faster; but a server crash right
-- after it can lose the count, and the same attempt number is then handed out twice (the fence
-- cannot tell those executions apart).
-- name: claim_leased_lossy
update jobqueue.jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
  from (select set_config('synchronous_commit', 'off', true)) as lossy
 where id = any(array(select id from jobqueue.claimable
                       where queue = (%(queues)s::text[])[1]
                         and priority = any('{10,9,8,7,6,5,4,3,2,1,0,-1,-2,-3,-4,-5,-6,-7,-8,-9,-10}'::smallint[])
                         and kind = any(%(kinds)s::text[])
                       order by priority desc, claimable_at, id limit %(batch)s
                       for update skip locked))
returning id, tenant_id, attempts as attempt, kind, payload;

-- Run by Leased.claim for a worker that serves several queues: the same claim, one order across
-- them (priority, then age). Each queue is read as claim_leased reads one (its own index range,
-- bounded), up to the batch each, then the first of them all are taken. The price of more than
-- one queue: up to a batch per queue is locked for the statement, and only a batch updated.
-- The queues are read through a scalar subquery on purpose: a bare unnest of the bound array is
-- estimated at its real length in a custom plan and at 100 rows in the generic one, so
-- PostgreSQL kept planning the claim afresh every time (0.14 ms per claim, measured with
-- pg_stat_statements.track_planning); behind the subquery both estimate alike and the prepared
-- claim keeps one generic plan.
-- name: claim_leased_queues
update jobqueue.jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = any(array(
         select job.id
           from unnest((select %(queues)s::text[])) as served(queue)
          cross join lateral (
                select c.id, c.priority, c.claimable_at from jobqueue.claimable c
                 where c.queue = served.queue and c.priority = any('{10,9,8,7,6,5,4,3,2,1,0,-1,-2,-3,-4,-5,-6,-7,-8,-9,-10}'::smallint[])
                   and c.kind = any(%(kinds)s::text[])
                 order by c.priority desc, c.claimable_at, c.id limit %(batch)s
                 for update skip locked) as job
          order by job.priority desc, job.claimable_at, job.id
          limit %(batch)s))
returning id, tenant_id, attempts as attempt, kind, payload;

-- Run by Leased.claim with lossy_claim=True for a worker that serves several queues.
-- name: claim_leased_queues_lossy
update jobqueue.jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
  from (select set_config('synchronous_commit', 'off', true)) as lossy
 where id = any(array(
         select job.id
           from unnest((select %(queues)s::text[])) as served(queue)
          cross join lateral (
                select c.id, c.priority, c.claimable_at from jobqueue.claimable c
                 where c.queue = served.queue and c.priority = any('{10,9,8,7,6,5,4,3,2,1,0,-1,-2,-3,-4,-5,-6,-7,-8,-9,-10}'::smallint[])
                   and c.kind = any(%(kinds)s::text[])
                 order by c.priority desc, c.claimable_at, c.id limit %(batch)s
                 for update skip locked) as job
          order by job.priority desc, job.claimable_at, job.id
          limit %(batch)s))
returning id, tenant_id, attempts as attempt, kind, payload;

-- Run by Leased.execute as the first statement of the work's transaction: the tenant in its
-- local form (it ends with the transaction, whatever the outcome), only while this attempt still
-- owns the job and its lease has not run out (no row: do not start; another worker may already
-- run it). A read: it takes no transaction id and, in READ COMMITTED, holds no snapshot after
-- it, so a handler that does not write holds nothing VACUUM waits for. The setting's name
-- (default app.tenant, WorkerOptions.tenant_setting) is bound like the tenant.
-- name: start_if_owner
select clock_timestamp() as started, set_config(%(setting)s, %(tenant)s, true)
  from jobqueue.jobs
 where id = %(id)s and attempts = %(attempt)s and status = 'running'
   and locked_until > clock_timestamp();

-- Run by handlers that need the tenant set again (or set by hand): the local form only.
-- name: tenant_set_local
select set_config(%(setting)s, %(tenant)s, true);

-- Run by Leased.execute as the last statement of the work's transaction: only the attempt that
-- was claimed may finish; the execution's job_runs row is written with it (outcome 'done', the
-- column's default). last_error stays: the error this job recovered from, if any (the status
-- says it is done; job_runs has every attempt). Returns how many jobs it finished (0 = fenced
-- out: roll back) and the run's id.
-- name: complete_if_owner
with done as (
  update jobqueue.jobs set status = 'done', locked_until = null, finished = clock_timestamp()
   where id = %(id)s and attempts = %(attempt)s and status = 'running'
  returning id
), run as (
  insert into jobqueue.job_runs (job_id, worker, attempt, started, finished)
  select id, %(worker)s, %(attempt)s, coalesce(%(started)s::timestamptz, clock_timestamp()),
         clock_timestamp()
    from done
  returning id
)
select count(*) as finished, (select id from run) as run from done;

-- Sent by Leased.run_together with its first statement (BEGIN) and its last (COMMIT), on the
-- worker's autocommit connection: the batch's transaction costs no round trip of its own.
-- name: begin
begin;

-- name: commit
commit;

-- Run by the watchdog (Leased._overdue) in a transaction of its own before its fenced fail:
-- how long it may wait for the job's row lock (a batch holds its rows until it commits).
-- name: lock_timeout_local
select set_config('lock_timeout', %(ms)s, true);

-- Run by Leased.run_together (--batch-commit) as the batch's first statement: every claim's
-- fence at once (this attempt, running, lease live), and the rows of those that pass locked
-- until the batch commits (FOR NO KEY UPDATE, in id order: two batches never wait on each other
-- in opposite orders). While a row is locked no other session can change it: the claims and the
-- reaper skip locked rows, the heartbeat skips them without waiting (it cannot extend those
-- leases, and needs not: nobody can take the job meanwhile), `cancel` waits for the commit. So
-- each job's fence, checked here, holds to the batch's commit, and its finish cannot be fenced
-- out by another session. The price: a row lock takes a transaction id, so the batch holds one
-- (and the VACUUM horizon) from its start, where a batch without locks took it at its first
-- finish. A claim missing from the rows is not started (fenced). `now`: the server's clock, from
-- which the batch reads its jobs' start and end times.
-- name: lock_batch_if_owner
select jobs.id, clock_timestamp() as now
  from jobqueue.jobs
  join unnest(%(ids)s::bigint[], %(attempts)s::int[]) as held(id, attempt)
    on held.id = jobs.id and held.attempt = jobs.attempts
 where jobs.status = 'running' and jobs.locked_until > clock_timestamp()
 order by jobs.id
   for no key update of jobs;

-- Run by Leased.run_together for each job of a locked batch (its fence is held by
-- lock_batch_if_owner), right before the first statement its handler sends (a handler that sends
-- none needs neither): a savepoint of the job's own (the handler's error rolls back to it; one
-- name for all, nested: a rollback finds the latest, this job's), then the tenant in its local
-- form, bound client-side. One simple-protocol message: no portal or snapshot left open.
-- name: start_in_batch
savepoint jobqueue_job;
select set_config(%(setting)s, %(tenant)s, true);

-- Run by Leased.run_together when a job of the batch failed: back to its savepoint (what its
-- handler wrote, and its tenant, roll back; the jobs before it stay).
-- name: rollback_job
rollback to savepoint jobqueue_job;

-- Run by Leased.run_together at the end of a locked batch: every job that succeeded finished at
-- once, each only for the attempt that was claimed (the fence: id and attempt), with its
-- job_runs row (its own start and end, server clock; an end not known yet is now). Returns one
-- row per job finished with its run's id; a job missing was changed by the batch's own
-- transaction (no other session can while the rows are locked): the caller records it fenced.
-- name: complete_batch_if_owner
with batch as (
  select * from unnest(%(ids)s::bigint[], %(attempts)s::int[], %(started)s::timestamptz[],
                       %(finished)s::timestamptz[]) as b(id, attempt, started, finished)
), done as (
  update jobqueue.jobs
     set status = 'done', locked_until = null,
         finished = coalesce(batch.finished, clock_timestamp())
    from batch
   where jobs.id = batch.id and jobs.attempts = batch.attempt and jobs.status = 'running'
  returning jobs.id, batch.attempt, coalesce(batch.started, jobs.finished) as started,
            jobs.finished
), run as (
  insert into jobqueue.job_runs (job_id, worker, attempt, started, finished)
  select id, %(worker)s, attempt, started, finished from done
  returning job_id, id
)
select job_id, id from run;

-- Run by Leased.execute instead of complete_if_owner when the worker goes on: the fenced
-- finish of this job and the claim of the next ones, committed together. One durable commit
-- per job instead of two, and the guarantees hold: the next attempts are counted (and their
-- leases set) when this commits, before their work starts; a fenced finish rolls the claim
-- back with everything else. One row per job claimed (or one with nulls): `finished` = 0 is
-- fenced out (roll back).
-- name: complete_if_owner_and_claim
with done as (
  update jobqueue.jobs set status = 'done', locked_until = null, finished = clock_timestamp()
   where id = %(id)s and attempts = %(attempt)s and status = 'running'
  returning id
), run as (
  insert into jobqueue.job_runs (job_id, worker, attempt, started, finished)
  select id, %(worker)s, %(attempt)s, coalesce(%(started)s::timestamptz, clock_timestamp()),
         clock_timestamp()
    from done
  returning id
), next as (
  update jobqueue.jobs
     set status = 'running', attempts = attempts + 1,
         locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
   where id = any(array(select id from jobqueue.claimable
                         where queue = (%(queues)s::text[])[1]
                           and priority = any('{10,9,8,7,6,5,4,3,2,1,0,-1,-2,-3,-4,-5,-6,-7,-8,-9,-10}'::smallint[])
                           and kind = any(%(kinds)s::text[]) and id <> %(id)s
                         order by priority desc, claimable_at, id limit %(batch)s
                         for update skip locked))
  returning id, tenant_id, attempts as attempt, kind, payload
)
select (select count(*) from done) as finished, (select id from run) as run,
       next.id, next.tenant_id, next.attempt, next.kind, next.payload
  from (select) as one left join next on true;

-- Run by Leased.fail after the work failed (in a new transaction, or in the batch's after
-- rolling back to the job's savepoint): fenced like the completion. Queued again after a
-- backoff that doubles with each attempt (times 0.75..1.25 of jitter, capped), or dead at
-- max_attempts. The attempt's job_runs row (outcome failed or dead, the error with the last
-- lines of its traceback) is written by the same statement: the handler's work rolled back,
-- the record of the attempt is kept. No row back = fenced out (and no run row).
-- name: fail_if_owner
with failed as (
  update jobqueue.jobs
     set status = case when attempts >= max_attempts then 'dead' else 'queued' end,
         locked_until = null,
         last_error = %(error)s,
         finished = case when attempts >= max_attempts then clock_timestamp() end,
         run_after = clock_timestamp() + case when %(backoff)s::float8 > 0 then make_interval(
           secs => least(%(backoff_cap)s::float8, %(backoff)s::float8 * power(2, attempts - 1))
                   * (0.75 + random() * 0.5)) else interval '0' end
   where id = %(id)s and attempts = %(attempt)s and status = 'running'
  returning status, attempts, run_after
), run as (
  insert into jobqueue.job_runs (job_id, worker, attempt, started, finished, outcome, error)
  select %(id)s, %(worker)s, %(attempt)s,
         coalesce(%(started)s::timestamptz, clock_timestamp()), clock_timestamp(),
         case when status = 'dead' then 'dead' else 'failed' end, left(%(error)s, 2000)
    from failed
)
select status, attempts, run_after from failed;

-- Run by Leased after a fenced finish rolled back (or a start that found the lease gone), on
-- the same connection outside the work's transaction: the attempt's job_runs row, so `show`
-- tells the whole story. 'cancelled' when an operator cancelled the job while it ran.
-- name: record_fenced
insert into jobqueue.job_runs (job_id, worker, attempt, started, finished, outcome, error)
select id, %(worker)s, %(attempt)s, coalesce(%(started)s::timestamptz, clock_timestamp()),
       clock_timestamp(), case when status = 'cancelled' then 'cancelled' else 'fenced' end,
       left(%(error)s, 2000)
  from jobqueue.jobs
 where id = %(id)s
returning outcome;

-- Run by the heartbeat on its own connection: extends the leases of every job this worker
-- holds, each only for the attempt it claimed. It never waits on a row lock (a batch's
-- transaction may hold one until it commits; waiting there could deadlock): a locked row is
-- skipped this beat and tried again soon. One row per job still owned, with its new lease (null:
-- skipped, locked); a job missing from the rows was lost (another attempt owns it, or it ended).
-- name: heartbeat_if_owner_many
with held as (
  select * from unnest(%(ids)s::bigint[], %(attempts)s::int[]) as held(id, attempt)
), owned as (
  select jobs.id from jobqueue.jobs join held on held.id = jobs.id
   where jobs.attempts = held.attempt and jobs.status = 'running'
), free as (
  select id from jobqueue.jobs where id in (select id from owned)
   for no key update skip locked
), extended as (
  update jobqueue.jobs
     set locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
    from held
   where jobs.id = held.id and jobs.attempts = held.attempt and jobs.status = 'running'
     and jobs.id in (select id from free)
  returning jobs.id, jobs.locked_until
)
select owned.id, extended.locked_until from owned left join extended using (id);

-- Run by the heartbeat when jobs it held were not its own any more: which of them an operator
-- cancelled (the others were taken over by another attempt).
-- name: cancelled_among
select id from jobqueue.jobs where id = any(%(ids)s::bigint[]) and status = 'cancelled';

-- Run by Heartbeat users that extend one job: its lease, only for the attempt it claimed.
-- name: heartbeat_if_owner
update jobqueue.jobs
   set locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = %(id)s and attempts = %(attempt)s and status = 'running'
returning locked_until;

-- Run by the reaper: jobs whose lease expired more than `grace` seconds ago. Exhausted ones
-- become dead; with requeue, the others go back to queued. A live worker that merely overran
-- its lease is fenced out by this (see the reaper's docstring). Reads jobs_running_lease.
-- name: reap_expired
update jobqueue.jobs
   set status = case when attempts >= max_attempts then 'dead' else 'queued' end,
       locked_until = null,
       run_after = clock_timestamp(),
       finished = case when attempts >= max_attempts then clock_timestamp() end,
       last_error = 'reaped: lease expired at attempt ' || attempts
 where id in (select id from jobqueue.jobs
               where status = 'running'
                 and locked_until < clock_timestamp() - make_interval(secs => %(grace)s)
                 and (attempts >= max_attempts or %(requeue)s)
               order by locked_until limit %(batch)s
               for update skip locked)
returning id, tenant_id, attempts, status;

-- Run by prune: delete one batch of jobs finished (done, dead or cancelled) more than `age`
-- seconds ago, oldest first. Walks the primary key from the oldest job: a batch stops early.
-- name: prune_jobs
delete from jobqueue.jobs
 where id in (select id from jobqueue.jobs
               where status in ('done', 'dead', 'cancelled')
                 and coalesce(finished, created) < clock_timestamp() - make_interval(secs => %(age)s)
               order by id limit %(batch)s
               for update skip locked)
returning id;

-- Run by prune: delete one batch of job_runs rows started more than `age` seconds ago.
-- name: prune_runs
delete from jobqueue.job_runs
 where id in (select id from jobqueue.job_runs
               where started < clock_timestamp() - make_interval(secs => %(age)s)
               order by id limit %(batch)s)
returning id;

-- Run by tests and tools that embed the queue: how many jobs are in each state.
-- An operator's view is `python -m jobqueue stats` (ops.py: the stats_* queries below).
-- name: job_counts
select status, count(*) as jobs from jobqueue.jobs group by status order by status;

-- ---------------------------------------------------------------------------------------------
-- Migrations (migrations.py): run by `migrate` as the role that owns the queue's tables.

-- name: migrate_lock
select pg_advisory_xact_lock(hashtext('jobqueue migrate'));

-- Held by migrate for its whole run, online migrations included (they run outside a transaction).
-- name: migrate_session_lock
select pg_advisory_lock(hashtext('jobqueue migrate'));

-- name: migrate_session_unlock
select pg_advisory_unlock(hashtext('jobqueue migrate'));

-- Run by migrate before an online migration builds its indexes: those a stopped build left
-- invalid.
-- name: invalid_indexes
select c.relname from pg_index i join pg_class c on c.oid = i.indexrelid
 where c.relnamespace = 'jobqueue'::regnamespace and not i.indisvalid
 order by 1;

-- name: migrate_lock_timeout
select set_config('lock_timeout', %(ms)s, true);

-- Run by migrate after a lock timeout: who holds a lock on the queue's tables (for its message).
-- name: migrate_blockers
select distinct format('pid %s (%s, %s for %s)', a.pid, coalesce(nullif(a.application_name, ''), a.usename),
                       a.state, date_trunc('second', clock_timestamp() - a.xact_start))
  from pg_locks l join pg_class c on c.oid = l.relation
  join pg_namespace n on n.oid = c.relnamespace and n.nspname = 'jobqueue'
  join pg_stat_activity a on a.pid = l.pid
 where l.granted and l.pid <> pg_backend_pid();

-- Run by migrate when it applied something, in its transaction: running workers re-check the
-- schema's version at once.
-- name: migrate_notify
select pg_notify('jobqueue', 'migrated');

-- name: migrations_bootstrap
create schema if not exists jobqueue;
create table if not exists jobqueue.migrations (
  version int primary key,
  name    text not null,
  applied timestamptz not null default clock_timestamp()
);

-- The type of the tenant ids, as installed (no row: not installed yet).
-- name: tenant_type_of
select format_type(t.typbasetype, t.typtypmod)
  from pg_type t join pg_namespace n on n.oid = t.typnamespace
 where n.nspname = 'jobqueue' and t.typname = 'tenant_id' and t.typtype = 'd';

-- name: migrations_applied
select version from jobqueue.migrations order by version;

-- name: migration_record
insert into jobqueue.migrations (version, name) values (%(version)s, %(name)s);

-- Run by check at a worker's start: is the schema there, and may this role use it.
-- name: schema_state
select exists (select from pg_class c join pg_namespace n on n.oid = c.relnamespace
                where n.nspname = 'jobqueue' and c.relname = 'migrations') as installed,
       (select has_schema_privilege(oid, 'usage') from pg_namespace
         where nspname = 'jobqueue') as usage;

-- name: schema_version
select max(version) from jobqueue.migrations;

-- What a worker needs and this role lacks (each privilege alone: has_table_privilege with a
-- list is true when any of them is held): every table and privilege its statements touch.
-- `uses`: the optional parts the worker runs ('periodic': it has schedules; 'round-robin':
-- --fair round-robin), checked on its first connection (`parts_only`); the rest every worker
-- needs, checked by the preflight. An INSERT ... RETURNING and an ON
-- CONFLICT DO UPDATE read what they return or compare: select too.
-- name: missing_grants
select p.privilege || ' on ' || p.object
  from (values ('select', 'jobqueue.jobs', null), ('update', 'jobqueue.jobs', null),
               ('insert', 'jobqueue.job_runs', null), ('select', 'jobqueue.job_runs', null),
               ('select', 'jobqueue.claimable', null), ('update', 'jobqueue.claimable', null),
               ('select', 'jobqueue.migrations', null),
               ('select', 'jobqueue.workers', null), ('insert', 'jobqueue.workers', null),
               ('update', 'jobqueue.workers', null), ('delete', 'jobqueue.workers', null),
               ('insert', 'jobqueue.jobs', 'periodic'), ('select', 'jobqueue.periodic', 'periodic'),
               ('insert', 'jobqueue.periodic', 'periodic'),
               ('update', 'jobqueue.periodic', 'periodic'),
               ('select', 'jobqueue.tenant_turns', 'round-robin'),
               ('insert', 'jobqueue.tenant_turns', 'round-robin'),
               ('update', 'jobqueue.tenant_turns', 'round-robin'))
       as p(privilege, object, part)
 where (p.part is null and not %(parts_only)s or p.part = any(%(uses)s::text[]))
   and not has_table_privilege(p.object, p.privilege);

-- ---------------------------------------------------------------------------------------------
-- Fair claims (`--fair`): the same claim as claim_leased (attempt counted, lease set, the same
-- columns back, so execute, the fence, the heartbeat and the reaper are unchanged), with
-- another choice of job from the same view `claimable`. Each is one statement.

-- Run by Leased.claim with fair='round-robin': the first claimable job (highest priority first, in
-- the worker's queues) of the tenant served least recently, one job per tenant for a batch.
-- The walk is over tenant_turns, in turn order (tenant_turns_in_turn: an index range), each
-- tenant probed for an unlocked claimable job until the batch is full: a claim costs one probe
-- per tenant walked, not one per tenant with work. Tenants come into the walk by discovery:
-- the tenants of the `window` newest jobs, every claim (a new job is seen by the next claim),
-- and, when `full` (the worker asks every few seconds, fair.py), every tenant with work (a
-- skip scan over jobs_claimable_by_tenant: one descent per tenant) for what the window missed
-- (a job retried, back from a backoff or a lost lease; a burst bigger than the window). A
-- discovered tenant without a turn, or with an idle one, goes first ('-infinity': as never
-- served). A tenant walked past without a job to take is idle ('infinity', out of the walk)
-- until discovered again. Every turn is written with skip locked: a turn locked now is being
-- moved by another claim; waiting for it would line every worker up behind one tenant.
-- Guarantee: while a tenant has a claimable job it is in the walk (at the latest after the next
-- full discovery), and each other tenant is served at most once before it, plus the claims in
-- flight (one per other worker).
-- The tenant lookups (the listing's skip scan, the probe) name no kind a proof can use, so they
-- never read jobs_claimable, whose predicate names the kind (0005): with statistics older than
-- the queue (a bulk enqueue, a table just emptied) the planner answered the listing from it, a
-- scan of every claimable job per tenant (8.1 s and 2,460,000 buffers for one claim at 10,000
-- tenants, against about 0.2 s); each claim that long made the next one a full listing too.
-- Every set is read as `= any(array(...))`: primary-key lookups whatever the estimates, so the
-- plan PostgreSQL keeps for the prepared statement (a generic one) is as cheap as a fresh one;
-- `full` and `batch` are read through `(select ...)`, so a fresh plan cannot look cheaper by
-- folding them, and PostgreSQL keeps the generic plan instead of planning every claim again
-- (about 0.8 ms of a 1.8 ms claim at 10,000 tenants).
-- Not given: weights; two workers claiming at the same moment may serve the same tenant; a
-- long job still holds its worker; a tenant's job back from a backoff may wait for the next
-- full discovery (a few seconds) before its turn.
-- name: claim_round_robin
with recursive tenants as (
  (select tenant_id from jobqueue.jobs
    where (select %(full)s::boolean) and status in ('queued', 'running') and attempts < max_attempts
      and tenant_id is not null
    order by tenant_id limit 1)
  union all
  select (select j.tenant_id from jobqueue.jobs j
           where j.status in ('queued', 'running') and j.attempts < j.max_attempts
             and j.tenant_id > tenants.tenant_id
           order by j.tenant_id limit 1)
    from tenants
   where tenants.tenant_id is not null
), recent as (
  -- The newest jobs: their ids looked up together, one descent of the primary key (never a scan).
  -- Whether each has work is read in the select list, not the WHERE clause: a WHERE that named
  -- the claimable jobs' predicate let the planner, with statistics older than the queue (jobs
  -- never analyzed since a bulk enqueue), read jobs_claimable whole for these ids instead.
  select distinct w.tenant_id
    from (select case when j.status in ('queued', 'running') and j.attempts < j.max_attempts
                      then j.tenant_id end as tenant_id
            from jobqueue.jobs j
           where j.id = any(array(select generate_series(m.id - %(window)s + 1, m.id)
                                    from (select max(id) as id from jobqueue.jobs) as m))) as w
   where w.tenant_id is not null
), fresh as (
  -- Found with work, and not in the walk (no turn, or an idle one).
  select found.tenant_id
    from (select tenant_id from tenants where tenant_id is not null
          union select tenant_id from recent) as found
   -- A lookup per tenant found (a correlated subquery: never a scan of every turn).
   where coalesce((select t.last_served < 'infinity' from jobqueue.tenant_turns t
                    where t.tenant_id = found.tenant_id), false) = false
), picked as (
  -- The walk, ordered in subqueries of their own, then probed lazily: the probe (and its row
  -- lock) runs for the tenants walked, never for all of them.
  select job.id, turn.tenant_id, turn.in_walk, turn.last_served
    from ((select tenant_id, false as in_walk, null::timestamptz as last_served
             from fresh order by tenant_id)
          union all
          (select tenant_id, true, last_served from jobqueue.tenant_turns
            where last_served < 'infinity'
            order by last_served, tenant_id)) as turn
   cross join lateral (
         -- The kinds as `(...) is true`, not `kind = any(...)`: a test that cannot prove `kind
         -- is not null`, so jobs_claimable (whose predicate says it, 0005) never answers the
         -- probe, whatever the statistics: with statistics older than the queue it was chosen,
         -- the tenant as a filter (about 100 buffers a probe at 2,000 tenants instead of 3).
         -- Both kinds and queues are filters of jobs_claimable_by_tenant anyway.
         select c.id from jobqueue.claimable c
          where c.tenant_id = turn.tenant_id and (c.kind = any(%(kinds)s::text[])) is true
            and c.queue = any(%(queues)s::text[]) and c.priority = any('{10,9,8,7,6,5,4,3,2,1,0,-1,-2,-3,-4,-5,-6,-7,-8,-9,-10}'::smallint[])
          order by c.priority desc, c.claimable_at, c.id limit 1
          for update skip locked) as job
   limit (select %(batch)s::int)
), walked as (
  -- Where the walk stopped: the last tenant in the walk served now; all of them when the batch
  -- is not full; none when only discovered tenants were served ('-infinity', null).
  select case when full_batch then coalesce(last.last_served, '-infinity')
              else 'infinity' end as last_served,
         case when full_batch then last.tenant_id end as tenant_id
    from (select count(*) >= %(batch)s as full_batch from picked) as n
    left join (select last_served, tenant_id from picked where in_walk
                order by last_served desc, tenant_id desc limit 1) as last on true
), idle as (
  -- The tenants in the walk passed over: no job to take now (an index range of the walk).
  update jobqueue.tenant_turns set last_served = 'infinity'
   where tenant_id = any(array(
         select t.tenant_id from jobqueue.tenant_turns t
          where t.last_served < 'infinity'
            and (t.last_served, t.tenant_id)
                < ((select last_served from walked), (select tenant_id from walked))
            and t.tenant_id not in (select tenant_id from picked)
          order by t.last_served, t.tenant_id
          for no key update skip locked))
), moved as (
  update jobqueue.tenant_turns set last_served = clock_timestamp()
   where tenant_id = any(array(select tenant_id from jobqueue.tenant_turns
                                where tenant_id = any(array(select tenant_id from picked))
                                for no key update skip locked))
), woken as (
  -- Discovered, idle, not served now: first in the walk from the next claim on.
  update jobqueue.tenant_turns set last_served = '-infinity'
   where tenant_id = any(array(select t.tenant_id from jobqueue.tenant_turns t
                                where t.tenant_id = any(array(select tenant_id from fresh))
                                  and t.tenant_id not in (select tenant_id from picked)
                                  and t.last_served = 'infinity'
                                for no key update skip locked))
), first_turn as (
  -- Tenants without a turn yet (in this snapshot): served now, or first in the walk next.
  insert into jobqueue.tenant_turns (tenant_id, last_served)
  select fresh.tenant_id,
         case when fresh.tenant_id in (select tenant_id from picked) then clock_timestamp()
              else '-infinity' end
    from fresh
   where not exists (select from jobqueue.tenant_turns t where t.tenant_id = fresh.tenant_id)
   order by fresh.tenant_id
  on conflict (tenant_id) do nothing
)
update jobqueue.jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = any(array(select id from picked))
returning id, tenant_id, attempts as attempt, kind, payload;

-- Run by Leased.claim with fair='limit=N': the FIFO claim, skipping the jobs of tenants that
-- already run N jobs (running, lease not expired: a dead worker's job stops counting when its
-- lease does). The busy tenants come from jobs_running_lease (one row per running job).
-- A soft limit: two claims at the same moment can both see N-1 and both take one (N+1), and a
-- batch can take several jobs of a tenant below N. It helps only with more workers than N; the
-- walk passes the busy tenants' claimable jobs (the noisy backlog) before it finds another's.
-- The queues and the batch are read through `(select ...)`: a fresh plan, which sees one queue and
-- a batch of 1, looked 5 times cheaper than the generic one (which guesses 10 queues and a tenth
-- of the rows), so PostgreSQL planned every claim again (0.26 ms a claim, 0.07 with the plan kept).
-- name: claim_limit
with busy as (
  select tenant_id from jobqueue.jobs
   where status = 'running' and locked_until >= clock_timestamp()
   group by tenant_id
  having count(*) >= %(limit)s
)
update jobqueue.jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = any(array(
         select job.id
           from unnest((select %(queues)s::text[])) as served(queue)
          cross join lateral (
                select c.id, c.priority, c.claimable_at from jobqueue.claimable c
                 where c.queue = served.queue and c.priority = any('{10,9,8,7,6,5,4,3,2,1,0,-1,-2,-3,-4,-5,-6,-7,-8,-9,-10}'::smallint[])
                   and c.kind = any(%(kinds)s::text[])
                   and c.tenant_id not in (select tenant_id from busy)
                 order by c.priority desc, c.claimable_at, c.id limit (select %(batch)s::int)
                 for update skip locked) as job
          order by job.priority desc, job.claimable_at, job.id
          limit (select %(batch)s::int)))
returning id, tenant_id, attempts as attempt, kind, payload;

-- ---------------------------------------------------------------------------------------------
-- Workers (worker.py): who runs now, and the kinds each serves. Read by `stats`.

-- Run by Worker at its start (start = true) and then every third of its time to live, between
-- jobs and by its heartbeat during a long one: this worker is alive until `expires`. At start it
-- also forgets workers that expired more than a day ago.
-- name: worker_seen
with forget as (
  delete from jobqueue.workers
   where %(start)s and expires < clock_timestamp() - interval '1 day' and name <> %(name)s
)
insert into jobqueue.workers as w (name, kinds, expires)
values (%(name)s, %(kinds)s, clock_timestamp() + make_interval(secs => %(ttl)s))
on conflict (name) do update
   set kinds = excluded.kinds, last_seen = clock_timestamp(), expires = excluded.expires,
       started = case when %(start)s then clock_timestamp() else w.started end;

-- Run by Worker when it stops: it serves nothing any more.
-- name: worker_gone
delete from jobqueue.workers where name = %(name)s;

-- ---------------------------------------------------------------------------------------------
-- The operator's commands (ops.py): stats, jobs, show, retry, cancel.

-- Run by `stats`, `jobs` and `show`: the server's clock, which the ages they print are measured
-- by (never the operator's host's).
-- name: server_now
select clock_timestamp();

-- Run by `stats`: job counts per status, per status and kind, per status and tenant, in one
-- pass over jobs (`by`: 'status', 'kind' or 'tenant').
-- name: stats_counts
select case grouping(kind, tenant_id) when 3 then 'status' when 1 then 'kind' else 'tenant' end
         as by,
       status, kind, tenant_id::text as tenant, count(*) as jobs
  from jobqueue.jobs
 group by grouping sets ((status), (status, kind), (status, tenant_id))
 order by 1, status, count(*) desc, kind, tenant;

-- Run by `stats`: how long the oldest queued job has waited since it could run (its run_after:
-- a scheduled or backing-off job waits from then), in seconds; null when none waits. Reads
-- jobs_claimable (the claimable jobs only, not the finished ones): `length(kind) >= 0`, always
-- true, proves its predicate's `kind is not null` (0005; PostgreSQL 17 drops a written `kind
-- is not null` on a not-null column before it tries the proof).
-- name: stats_oldest_queued
select extract(epoch from clock_timestamp() - min(claimable_at))::float8 as oldest_queued_s
  from jobqueue.jobs
 where status = 'queued' and attempts < max_attempts and claimable_at <= clock_timestamp()
   and length(kind) >= 0;

-- Run by `stats`: the kinds of queued jobs that no running worker serves (a worker whose row
-- expired is not running), and the workers that are.
-- name: stats_kinds_without_worker
select kind from jobqueue.jobs where status = 'queued'
except
select unnest(kinds) from jobqueue.workers where expires > clock_timestamp()
order by 1;

-- Run by `stats`: running jobs whose lease ran out: no worker extends them any more (it
-- stopped, lost the server, was starved past its lease, or let the job go at its maximum
-- runtime); another worker takes each over (counted), or the reaper at max_attempts. Reads
-- jobs_running_lease.
-- name: stats_lease_expired
select id, kind, tenant_id::text as tenant, attempts, max_attempts,
       extract(epoch from clock_timestamp() - locked_until)::float8 as expired_s
  from jobqueue.jobs
 where status = 'running' and locked_until < clock_timestamp()
 order by locked_until
 limit 20;

-- name: stats_workers
select name, kinds, started, last_seen from jobqueue.workers
 where expires > clock_timestamp() order by name;

-- Run by `jobs`: the newest jobs first, each filter optional (null: any).
-- name: jobs_list
select id, kind, tenant_id as tenant, status, attempts, max_attempts, last_error,
       created, finished
  from jobqueue.jobs
 where (%(status)s::text is null or status = %(status)s)
   and (%(kind)s::text is null or kind = %(kind)s)
   and (%(tenant)s::text is null or tenant_id::text = %(tenant)s)
 order by id desc
 limit %(limit)s;

-- Run by `show`: one job.
-- name: job_show
select id, kind, tenant_id as tenant, status, attempts, max_attempts, payload, created,
       run_after, locked_until, finished, last_error
  from jobqueue.jobs
 where id = %(id)s;

-- Run by `show`: the job's attempts that ended, in order (job_runs_by_job).
-- name: job_attempts
select attempt, worker, started, finished, outcome, error
  from jobqueue.job_runs
 where job_id = %(id)s
 order by attempt, id;

-- Run by `retry ID`: a dead or cancelled job queued again at once, with a fresh budget of
-- `attempts` more attempts (max_attempts = attempts so far + that). The attempt count goes on
-- (never back to 0): the fence tells every attempt apart, also a late finish of an old one.
-- Not a job cancelled while running whose attempt may still run: it keeps its lease (no longer
-- extended) until its worker records the attempt's end; a retry before that would run it twice
-- at once. Wakes the idle workers. No row: no such job, not dead or cancelled, or that.
-- name: retry_job
with retried as (
  update jobqueue.jobs
     set status = 'queued', max_attempts = attempts + %(attempts)s, run_after = clock_timestamp(),
         locked_until = null, finished = null
   where id = %(id)s and status in ('dead', 'cancelled')
     and not (status = 'cancelled' and locked_until > clock_timestamp()
              and not exists (select from jobqueue.job_runs r
                               where r.job_id = jobs.id and r.attempt = jobs.attempts))
  returning id, kind, tenant_id as tenant, attempts, max_attempts
)
select retried.*, pg_notify('jobqueue', '') from retried;

-- Run by `retry ID` when retry_job changed nothing: a cancelled job whose attempt may still
-- run, and until when its lease holds (no row: not that case).
-- name: cancelled_still_running
select attempts, locked_until,
       extract(epoch from locked_until - clock_timestamp())::float8 as holds_s
  from jobqueue.jobs
 where id = %(id)s and status = 'cancelled' and locked_until > clock_timestamp()
   and not exists (select from jobqueue.job_runs r
                    where r.job_id = jobs.id and r.attempt = jobs.attempts);

-- Run by `retry --dead [--kind K] [--tenant T]`: every dead job (of that kind, of that tenant)
-- queued again like retry_job, except a job whose unique key a live job holds (queueing it would
-- break jobs_unique_key: it is left dead, and retry_dead_skipped says so), and of dead jobs
-- sharing a free key only the newest.
-- name: retry_dead
with dead as (
  select id, unique_key from jobqueue.jobs
   where status = 'dead'
     and (%(kind)s::text is null or kind = %(kind)s)
     and (%(tenant)s::text is null or tenant_id::text = %(tenant)s)
), retried as (
  update jobqueue.jobs
     set status = 'queued', max_attempts = attempts + %(attempts)s, run_after = clock_timestamp(),
         locked_until = null, finished = null
   where id in (select d.id from dead d
                 where d.unique_key is null
                    or (d.id = (select max(o.id) from dead o where o.unique_key = d.unique_key)
                        and not exists (select from jobqueue.jobs l
                                         where l.unique_key = d.unique_key
                                           and l.status in ('queued', 'running'))))
     and status = 'dead'
  returning id, kind, tenant_id as tenant, attempts, max_attempts
)
select retried.*, pg_notify('jobqueue', '') from retried order by id;

-- Run by `retry --dead` after retry_dead: the dead jobs (same filters) it left dead because a
-- live job holds their unique key, and that job.
-- name: retry_dead_skipped
select d.id, d.kind, d.tenant_id::text as tenant, d.unique_key, l.id as held_by,
       l.status as held_by_status
  from jobqueue.jobs d
  join jobqueue.jobs l on l.unique_key = d.unique_key and l.status in ('queued', 'running')
 where d.status = 'dead'
   and (%(kind)s::text is null or d.kind = %(kind)s)
   and (%(tenant)s::text is null or d.tenant_id::text = %(tenant)s)
 order by d.id;

-- Run by `cancel ID`: a queued or running job becomes cancelled; returns what it was. A running
-- job's worker is not interrupted: its heartbeat sees the job is no longer its own and stops
-- extending its lease (the handler can ask `claim.cancelled()`), and its finish matches no row
-- (fenced out). The lease it had is kept, not extended: until it runs out (or the attempt's end
-- is recorded) `retry` refuses the job, so a retry never runs beside the cancelled attempt. No
-- row: no such job, or already finished.
-- name: cancel_job
update jobqueue.jobs
   set status = 'cancelled', finished = clock_timestamp(),
       locked_until = case when prev.was = 'running' then jobs.locked_until end
  from (select id, status as was from jobqueue.jobs where id = %(id)s for no key update) as prev
 where jobs.id = prev.id and prev.was in ('queued', 'running')
returning prev.was;
