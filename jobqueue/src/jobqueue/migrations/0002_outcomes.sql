-- jobqueue migration 0002: every attempt's outcome kept, jobs that can be cancelled, and the
-- workers that run (for an operator's `stats`, `jobs`, `show`, `retry`, `cancel`).
-- No table is rewritten (the new columns have constant defaults); the checks scan job_runs and
-- jobs once, under the migration's lock: run it while the queue is quiet if job_runs is large.

-- One row per attempt that ended, written with its end: a done finish (complete_if_owner), a
-- failure in the same statement that records it (fail_if_owner: the handler's work rolled back,
-- the row kept), a fenced finish after the rollback (record_fenced). `outcome` 'done' by
-- default: the rows of earlier versions were all finishes.
alter table jobqueue.job_runs
  add column outcome text not null default 'done',
  add column error   text;
alter table jobqueue.job_runs
  add constraint outcome_is_known
    check (outcome in ('done', 'failed', 'dead', 'fenced', 'cancelled')),
  add constraint error_is_bounded check (char_length(error) <= 2000);

-- `show ID` reads a job's attempts by job id (one index entry more per attempt).
create index job_runs_by_job on jobqueue.job_runs (job_id);

-- `cancelled`: by an operator (`cancel ID`), from queued, or from running (then the worker's
-- finish matches no row: fenced out, the job stays cancelled).
alter table jobqueue.jobs drop constraint status_is_known;
alter table jobqueue.jobs add constraint status_is_known
  check (status in ('queued', 'running', 'done', 'dead', 'cancelled'));

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
