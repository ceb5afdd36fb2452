-- Notebook 09 (tenantlab/experiments/together.py): every fault at once. No DDL here.

-- Run by the supervisor's probe every quarter second: the cheapest look at the queue's head,
-- read-only. Slows down like a real fetch when dead index entries pile up under a held horizon.
-- name: together_probe
select id from jobs where status in ('queued', 'running') order by id limit 1;

-- Run by the supervisor: how many jobs have reached a final state (done or dead).
-- name: together_settled
select count(*) from jobs where status in ('done', 'dead');
