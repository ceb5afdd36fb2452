-- The queue's tables. Apply with `python -m tenantlab.jobqueue schema --dsn DSN` (or run this
-- file as the tables' owner); every statement is idempotent, and the command takes an advisory
-- lock, so workers started together cannot trip over each other's set-up. Then grant your
-- worker role: select, insert, update, delete on jobs; select, insert, update, delete on job_runs.
--
-- Keep jobs OUT of any tenant row-level-security policy: a worker must see every job before it
-- knows which tenant to become (with a policy, a worker without tenant context sees an empty
-- queue and no error).

create table if not exists jobs (
  id           bigint generated always as identity primary key,
  tenant_id    int not null,
  kind         text not null,
  payload      jsonb not null default '{}',
  status       text not null default 'queued',
  attempts     int not null default 0,
  max_attempts int not null default 3,
  locked_until timestamptz,
  run_after    timestamptz,
  last_error   text,
  created      timestamptz not null default clock_timestamp(),
  finished     timestamptz,
  constraint status_is_known check (status in ('queued', 'running', 'done', 'dead')),
  constraint attempts_within_budget check (attempts between 0 and max_attempts),
  constraint max_attempts_positive check (max_attempts > 0),
  constraint running_has_lease check (status <> 'running' or locked_until is not null)
);

-- What the claim reads, in the claim's order: only jobs that are not finished. Done and dead
-- jobs are not in it, so the claim costs the same with a million finished jobs as with none.
create index if not exists jobs_claimable on jobs (id) where status in ('queued', 'running');

-- What the reaper reads: running jobs by lease expiry (a handful: one per busy worker).
create index if not exists jobs_running_lease on jobs (locked_until) where status = 'running';

-- One row per execution, written when a job starts, in the work's transaction: a rollback
-- takes it with it, a finished execution has `finished` set. No foreign key: it is a log, and
-- `prune` deletes old jobs and old runs independently.
create table if not exists job_runs (
  id       bigint generated always as identity primary key,
  job_id   bigint not null,
  worker   text not null,
  attempt  int not null,
  started  timestamptz not null default clock_timestamp(),
  finished timestamptz,
  constraint finished_after_start check (finished is null or finished >= started)
);

-- The fair claims (`--fair round-robin|limit=N`) read jobs tenant by tenant: the claimable jobs
-- of one tenant, oldest first. The claim walks it to list the tenants with work (a skip scan:
-- one descent per tenant, whatever their backlog) and to take one tenant's oldest job.
create index if not exists jobs_claimable_by_tenant on jobs (tenant_id, id)
  where status in ('queued', 'running');

-- When each tenant was last served by the round-robin claim, which writes it (an upsert in the
-- claim statement: enqueue does not need it, and a tenant without a row counts as never
-- served). Grant the worker select, insert, update on it to use `--fair round-robin`.
create table if not exists tenant_turns (
  tenant_id   int primary key,
  last_served timestamptz not null
);
