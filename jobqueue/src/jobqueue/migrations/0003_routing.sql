-- jobqueue migration 0003: routing. Named queues, priorities, unique jobs, periodic jobs.
-- Adds columns with constant defaults (no table rewrite), replaces the two claim indexes by ones
-- in the new claim order, and adds the view's new columns at its end (create or replace view).

alter table jobqueue.jobs
  -- A worker serves a list of queues (default: 'default' only); a job in a queue no worker
  -- serves waits, queued.
  add column queue text not null default 'default',
  -- From -10 to 10, higher first; within a priority, the oldest claimable first (as before).
  add column priority smallint not null default 0,
  -- While a job with this key is queued or running, enqueueing another with the same key
  -- returns that job's id instead (jobs_unique_key).
  add column unique_key text,
  add constraint queue_is_named check (queue <> '' and length(queue) <= 200),
  add constraint unique_key_not_empty check (unique_key <> ''),
  -- The claims name every priority (queries.sql): widening the range changes them too.
  add constraint priority_in_range check (priority between -10 and 10);

-- What the FIFO claims read, in the claim's order: per queue, per priority (highest first), the
-- claimable jobs by when they became claimable. The claim names the queue and every priority,
-- so the scan of one (queue, priority) stops at the first job not yet due, as before, and other
-- queues cost it nothing.
drop index jobqueue.jobs_claimable;
create index jobs_claimable on jobqueue.jobs (queue, priority desc, claimable_at, id, kind)
  where status in ('queued', 'running') and attempts < max_attempts;

-- The fair claims: one tenant's next job, highest priority first.
drop index jobqueue.jobs_claimable_by_tenant;
create index jobs_claimable_by_tenant on jobqueue.jobs (tenant_id, priority desc, claimable_at, id)
  where status in ('queued', 'running') and attempts < max_attempts;

-- One live job per key: a finished (done, dead) job frees its key.
create unique index jobs_unique_key on jobqueue.jobs (unique_key)
  where unique_key is not null and status in ('queued', 'running');

create or replace view jobqueue.claimable with (security_invoker = true) as
  select id, tenant_id, kind, claimable_at, queue, priority
    from jobqueue.jobs
   where status in ('queued', 'running')
     and attempts < max_attempts
     and claimable_at <= statement_timestamp();

-- Periodic jobs: the last slot enqueued per schedule name. A worker enqueues a slot only by
-- moving its schedule's slot forward, in the statement that inserts the job: however many
-- workers run, each slot is enqueued once, and a late worker (an older slot, a slow clock) can
-- never enqueue a slot again, even after its job finished.
create table jobqueue.periodic (
  name      text primary key,
  last_slot timestamptz not null
);
