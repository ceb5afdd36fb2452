-- jobqueue migration 0004: a FIFO claim whose plan does not depend on fresh statistics.
-- The fair claims' index had the same predicate as jobs_claimable, so the planner could answer
-- the FIFO claim from it too: a scan of every claimable job, then a sort. With statistics that
-- say the table is small (right after `retry --dead` or a bulk enqueue of 100,000 jobs, before
-- autoanalyze) it chose that plan: each claim read the whole backlog (101,129 buffers, 234 ms,
-- against 45 buffers). The predicate below adds `tenant_id is not null` (always true: the
-- column is not null): the fair claims, which look a tenant up, still prove it; the FIFO claim,
-- which names no tenant, cannot, and is left with jobs_claimable, in its own order.
--
-- Online: each statement runs on its own, outside a transaction. `create index concurrently`
-- lets enqueues, claims and finishes go on while the index is built (a plain `create index`,
-- after `drop index`, held a lock that stopped every read and write of jobqueue.jobs for as
-- long as the build took). The new index is built under another name, the old one dropped, the
-- new one renamed; run again after a stop, the file ends in the same place.
-- jobqueue: online
create index concurrently if not exists jobs_claimable_by_tenant_0004
  on jobqueue.jobs (tenant_id, priority desc, claimable_at, id)
  where status in ('queued', 'running') and attempts < max_attempts and tenant_id is not null;
drop index concurrently if exists jobqueue.jobs_claimable_by_tenant;
alter index if exists jobqueue.jobs_claimable_by_tenant_0004 rename to jobs_claimable_by_tenant;

-- The round-robin claim walks the tenants in turn order: least recently served first; '-infinity'
-- is a tenant found with work and not served yet, 'infinity' an idle one, out of the walk.
create index concurrently if not exists tenant_turns_in_turn
  on jobqueue.tenant_turns (last_served, tenant_id);
