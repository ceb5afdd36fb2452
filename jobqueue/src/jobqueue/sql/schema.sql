-- The queue's whole schema as it stands after every migration, in one file to read (and to
-- apply with a migration tool of your own, instead of `python -m jobqueue migrate`). Not what
-- installs it: migrations/NNNN_*.sql do, in order (migrations.py). A test checks that the two
-- give the same catalog; a new migration changes this file too.

create schema jobqueue;

-- What `migrate` applied (the worker checks it at start: not behind this package).
create table jobqueue.migrations (
  version int primary key,
  name    text not null,
  applied timestamptz not null default clock_timestamp()
);

-- The application's tenant key, chosen at install (`migrate --tenant-type`): bigint here;
-- integer, uuid or text work the same.
create domain jobqueue.tenant_id as bigint;
create table jobqueue.jobs (
  id           bigint generated always as identity primary key,
  tenant_id    jobqueue.tenant_id not null,
  kind         text not null,
  payload      jsonb not null default '{}',
  status       text not null default 'queued',
  attempts     int not null default 0,
  max_attempts int not null default 3,
  locked_until timestamptz,
  run_after    timestamptz not null default clock_timestamp(),
  last_error   text,
  created      timestamptz not null default clock_timestamp(),
  finished     timestamptz,
  -- Routing (0003): a worker serves a list of queues; higher priority runs first; while a job
  -- with a unique_key is queued or running, enqueueing that key again returns its id.
  queue        text not null default 'default',
  priority     smallint not null default 0,
  unique_key   text,
  -- When a claim may take the job: a queued job once its run_after has come, a running one once
  -- its lease has run out (taken over). One column, so one index serves every claim.
  claimable_at timestamptz generated always as
    (case when status = 'running' then locked_until else run_after end) stored,
  constraint status_is_known
    check (status in ('queued', 'running', 'done', 'dead', 'cancelled')),
  constraint attempts_within_budget check (attempts between 0 and max_attempts),
  constraint max_attempts_positive check (max_attempts > 0),
  constraint running_has_lease check (status <> 'running' or locked_until is not null),
  constraint queue_is_named check (queue <> '' and length(queue) <= 200),
  constraint unique_key_not_empty check (unique_key <> ''),
  -- The claims name every priority (queries.sql): widening the range changes them too.
  constraint priority_in_range check (priority between -10 and 10)
);

-- What the claim reads, in the claim's order: only jobs a claim could take some day. Finished
-- jobs and exhausted ones (attempts spent, waiting for the reaper) are not in it. Per queue and
-- priority (the claim names both: every priority, in order), jobs scheduled or backing off sort
-- after the ready ones, so the claim stops before it reaches them. Its predicate names the kind
-- (always not null) so that only a claim that names the worker's kinds can use it: round-robin's
-- tenant lookups, whatever the statistics say, read jobs_claimable_by_tenant in tenant order
-- (0005).
create index jobs_claimable on jobqueue.jobs (queue, priority desc, claimable_at, id, kind)
  where status in ('queued', 'running') and attempts < max_attempts and kind is not null;

-- What the reaper and the per-tenant limit read: running jobs by lease expiry (one per busy
-- worker slot).
create index jobs_running_lease on jobqueue.jobs (locked_until) where status = 'running';

-- The fair claims read the claimable jobs tenant by tenant (a skip scan lists the tenants with
-- work, one descent each; then one tenant's next job, highest priority first). Its predicate
-- names the tenant (always not null) so that only a claim that looks a tenant up can use it:
-- the FIFO claim, whatever the statistics say, reads jobs_claimable in its own order (0004).
create index jobs_claimable_by_tenant on jobqueue.jobs (tenant_id, priority desc, claimable_at, id)
  where status in ('queued', 'running') and attempts < max_attempts and tenant_id is not null;

-- One live job per key: a finished (done, dead) job frees its key.
create unique index jobs_unique_key on jobqueue.jobs (unique_key)
  where unique_key is not null and status in ('queued', 'running');

-- The one definition of what a claim may take now. Every claim (FIFO, fair, chained into a
-- finish) selects from it `for update skip locked`, ordered by claimable_at, id.
-- statement_timestamp() (stable, unlike clock_timestamp()) lets the index bound the scan.
create view jobqueue.claimable with (security_invoker = true) as
  select id, tenant_id, kind, claimable_at, queue, priority
    from jobqueue.jobs
   where status in ('queued', 'running')
     and attempts < max_attempts
     and claimable_at <= statement_timestamp();

-- One row per attempt that ended, written with its end: the fenced finish in the work's
-- transaction (so a handler that does not write holds no transaction id while it runs), a
-- failure in the statement that records it (the work rolled back, the row kept), a fenced
-- finish after its rollback. `error`: the error and the last lines of its traceback. No foreign
-- key: it is a log, and `prune` deletes old jobs and old runs independently.
create table jobqueue.job_runs (
  id       bigint generated always as identity primary key,
  job_id   bigint not null,
  worker   text not null,
  attempt  int not null,
  started  timestamptz not null,
  finished timestamptz,
  outcome  text not null default 'done',
  error    text,
  constraint finished_after_start check (finished is null or finished >= started),
  constraint outcome_is_known
    check (outcome in ('done', 'failed', 'dead', 'fenced', 'cancelled')),
  constraint error_is_bounded check (char_length(error) <= 2000)
);

-- `show ID` reads a job's attempts by job id (one index entry more per attempt).
create index job_runs_by_job on jobqueue.job_runs (job_id);

-- When each tenant was last served by the round-robin claim (`--fair round-robin`), which
-- writes it; a tenant without a row counts as never served.
create table jobqueue.tenant_turns (
  tenant_id   jobqueue.tenant_id primary key,
  last_served timestamptz not null
);

-- The round-robin claim walks the tenants in turn order: least recently served first; '-infinity'
-- is a tenant found with work and not served yet, 'infinity' an idle one, out of the walk (0004).
create index tenant_turns_in_turn on jobqueue.tenant_turns (last_served, tenant_id);

-- The workers running now, by name: the kinds each serves, written at its start and refreshed
-- while it lives (between jobs, and by its heartbeat during a long one); a row past `expires`
-- is a worker that stopped without saying so. `stats` reads it for the kinds no worker serves.
create table jobqueue.workers (
  name      text primary key,
  kinds     text[] not null,
  started   timestamptz not null default clock_timestamp(),
  last_seen timestamptz not null default clock_timestamp(),
  expires   timestamptz not null,
  constraint expires_after_seen check (expires >= last_seen)
);

-- Periodic jobs: the last slot enqueued per schedule name. A worker enqueues a slot only by
-- moving its schedule's slot forward, in the statement that inserts the job: each slot once,
-- however many workers run, and never again once a later slot (or the same) was recorded.
create table jobqueue.periodic (
  name      text primary key,
  last_slot timestamptz not null
);

-- After a bulk operation (enqueue_many, retry --dead of 1,000 jobs or more), the table's statistics
-- made afresh when the bulk outweighs them: every session's kept plans are made again (0006).
-- Security definer (ANALYZE needs the owner), never waiting; EXECUTE only where granted.
create function jobqueue.analyze_after_bulk(jobs bigint) returns boolean
  language plpgsql security definer
  set search_path = pg_catalog, pg_temp
as $$
begin
  -- Small bulks, and bulks the statistics already cover (the table held at least as many
  -- rows when last analyzed), change no plan: nothing to do.
  if jobs < 1000 or jobs < (select c.reltuples from pg_class c
                             where c.oid = 'jobqueue.jobs'::regclass) then
    return false;
  end if;
  begin
    lock table jobqueue.jobs in share update exclusive mode nowait;
  exception when lock_not_available then
    return false;
  end;
  analyze jobqueue.jobs;
  return true;
end
$$;
revoke execute on function jobqueue.analyze_after_bulk(bigint) from public;
