-- jobqueue migration 0006: after a bulk operation, the workers' kept plans are made again.
-- A running worker's statements are prepared (psycopg, after 5 executions) and PostgreSQL keeps
-- a generic plan for each, made with the table's size at that time. Made while the queue held
-- a few jobs, the plans of the claim and of the fenced start and finish (by id) are sequential
-- scans; after `enqueue_many` of 100,000 jobs each claim read 3,097 buffers (about 40 ms, a
-- sort spilled to disk) and each start or finish about 1,550, until autoanalyze, about a
-- minute later, made the plans be made again. A connection opened after the bulk plans afresh
-- and read 20. So the bulk operations (`enqueue_many`, `retry --dead`) analyze the table
-- themselves when what they queued outweighs what the statistics know of: the new statistics
-- make every session's kept plans on jobqueue.jobs be made again, with the table's real size.
--
-- Security definer: ANALYZE needs the table's owner (PostgreSQL 17: or MAINTAIN), which the
-- application's and the worker's roles are not. It takes no argument into SQL and analyzes
-- only jobqueue.jobs. Only the roles granted EXECUTE may run it (the README grants it to the
-- role that enqueues and to the worker's): revoked from PUBLIC, so no other role of the
-- database (an untrusted one) can make it analyze, and hold the table's analyze lock, at will.
-- It never waits: when another session holds the table's analyze lock (autovacuum, another
-- bulk), it does nothing (that one's statistics come soon). Returns whether it analyzed.
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
