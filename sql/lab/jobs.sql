-- The queue. Not under the tenant policy: a worker that serves every tenant must see every job
-- before it knows which tenant to become (finding rls-jobs shows what happens otherwise).
create table jobs (
  id           bigint generated always as identity primary key,
  tenant_id    int not null references tenants,
  kind         text not null default 'count',
  seconds      double precision not null default 0,
  status       text not null default 'queued',
  attempts     int not null default 0,
  max_attempts int not null default 3,
  locked_until timestamptz,
  run_after    timestamptz,
  last_error   text,
  created      timestamptz not null default clock_timestamp(),
  constraint status_is_known check (status in ('queued', 'running', 'done', 'dead')),
  constraint attempts_within_budget check (attempts between 0 and max_attempts),
  constraint max_attempts_positive check (max_attempts > 0),
  constraint running_has_lease check (status <> 'running' or locked_until is not null),
  constraint seconds_not_negative check (seconds >= 0)
);

-- One row per execution, written when a job starts: executions can be counted. No foreign
-- key: it is a log, and experiments delete jobs it refers to.
create table job_runs (
  id       bigint generated always as identity primary key,
  job_id   bigint not null,
  worker   text not null,
  attempt  int not null,
  started  timestamptz not null default clock_timestamp(),
  finished timestamptz,
  constraint finished_after_start check (finished is null or finished >= started)
);

grant select, insert, update, delete on jobs to tenantlab_worker;
grant select, insert, update on job_runs to tenantlab_worker;
