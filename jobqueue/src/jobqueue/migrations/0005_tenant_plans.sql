-- jobqueue migration 0005: round-robin's tenant lookups whose plans do not depend on fresh
-- statistics (0004 the other way round). The round-robin claim reads the claimable jobs tenant
-- by tenant: the full listing (a skip scan, one descent per tenant) and each tenant's probe.
-- Both could also be answered from jobs_claimable, whose predicate they proved: a scan of
-- every claimable job with the tenant as a filter, then a sort. With statistics older than the
-- queue (right after a bulk enqueue, or after the table was emptied: the statistics still say
-- no job is claimable) the planner chose it: a full listing over 10,000 tenants read
-- jobs_claimable once per tenant (2,460,000 buffers, 8.1 s for one claim, against about 50,000
-- and 0.2 s), and each probe at 2,000 tenants read about 100 buffers instead of 3. The
-- predicate below adds `kind is not null` (always true: the column is not null): the FIFO
-- claims, which name the worker's kinds (`kind = any(...)`), still prove it; the tenant
-- lookups, which name no kind the way a proof can use (queries.sql), cannot, and are left with
-- jobs_claimable_by_tenant, in tenant order.
--
-- Online, as 0004: built under another name, the old index dropped, the new one renamed; run
-- again after a stop, the file ends in the same place.
-- jobqueue: online
create index concurrently if not exists jobs_claimable_0005
  on jobqueue.jobs (queue, priority desc, claimable_at, id, kind)
  where status in ('queued', 'running') and attempts < max_attempts and kind is not null;
drop index concurrently if exists jobqueue.jobs_claimable;
alter index if exists jobqueue.jobs_claimable_0005 rename to jobs_claimable;
