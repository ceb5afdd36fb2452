"""``tenantlab check``: every failure mode the kit teaches, run against real queue libraries.

The suite owns the job bodies (``bodies``): every execution appends what it saw to a history
file outside the database (``history``), so a verdict never depends on the queue's own
bookkeeping. A queue is driven through an ``Adapter`` (``adapter``): install its schema in a
throwaway database, enqueue a job, start a worker process, map its job states. Scenarios are a
property, a bound and a checker over the history.
"""
