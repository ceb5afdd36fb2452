-- jobqueue migration 0001: the queue's tables, in the schema `jobqueue` (never an application's).
-- Applied once, in order, by `python -m jobqueue migrate` (migrations.py), as the role that will
-- own the tables; the runner has created the schema and the domain `jobqueue.tenant_id` (the
-- application's tenant key: bigint, integer, uuid or text, chosen at install) before this file.
-- Plain `create`, never `if not exists`: a table that is already there is an error, not adopted.
--
-- Keep jobs OUT of any tenant row-level-security policy: a worker must see every job before it
-- knows which tenant to become (with a policy it sees an empty queue, and no error).

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
  -- When a claim may take the job: a queued job once its run_after has come, a running one once
  -- its lease has run out (taken over). One column, so one index serves every claim.
  claimable_at timestamptz generated always as
    (case when status = 'running' then locked_until else run_after end) stored,
  constraint status_is_known check (status in ('queued', 'running', 'done', 'dead')),
  constraint attempts_within_budget check (attempts between 0 and max_attempts),
  constraint max_attempts_positive check (max_attempts > 0),
  constraint running_has_lease check (status <> 'running' or locked_until is not null)
);

-- What the claim reads, in the claim's order: only jobs a claim could take some day. Finished
-- jobs and exhausted ones (attempts spent, waiting for the reaper) are not in it; jobs scheduled
-- or backing off sort after the ready ones, so the claim stops before it reaches them.
create index jobs_claimable on jobqueue.jobs (claimable_at, id, kind)
  where status in ('queued', 'running') and attempts < max_attempts;

-- What the reaper and the per-tenant limit read: running jobs by lease expiry (one per busy
-- worker slot).
create index jobs_running_lease on jobqueue.jobs (locked_until) where status = 'running';

-- The fair claims read the claimable jobs tenant by tenant (a skip scan lists the tenants with
-- work, one descent each; then one tenant's next job).
create index jobs_claimable_by_tenant on jobqueue.jobs (tenant_id, claimable_at, id)
  where status in ('queued', 'running') and attempts < max_attempts;

-- The one definition of what a claim may take now. Every claim (FIFO, fair, chained into a
-- finish) selects from it `for update skip locked`, ordered by claimable_at, id.
-- statement_timestamp() (stable, unlike clock_timestamp()) lets the index bound the scan.
create view jobqueue.claimable with (security_invoker = true) as
  select id, tenant_id, kind, claimable_at
    from jobqueue.jobs
   where status in ('queued', 'running')
     and attempts < max_attempts
     and claimable_at <= statement_timestamp();

-- One row per finished execution, written by the fenced finish in the work's transaction (so a
-- handler that does not write holds no transaction id while it runs). No foreign key: it is a
-- log, and `prune` deletes old jobs and old runs independently.
create table jobqueue.job_runs (
  id       bigint generated always as identity primary key,
  job_id   bigint not null,
  worker   text not null,
  attempt  int not null,
  started  timestamptz not null,
  finished timestamptz,
  constraint finished_after_start check (finished is null or finished >= started)
);

-- When each tenant was last served by the round-robin claim (`--fair round-robin`), which
-- writes it; a tenant without a row counts as never served.
create table jobqueue.tenant_turns (
  tenant_id   jobqueue.tenant_id primary key,
  last_served timestamptz not null
);
