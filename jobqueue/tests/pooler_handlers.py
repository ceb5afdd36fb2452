"""Handlers for the pooler and outage tests' worker processes (``--handlers pooler_handlers``).

``noop`` does nothing; ``sleep`` sleeps ``payload["seconds"]`` inside the job's transaction (so
the heartbeat beats meanwhile) after a read with a parameter, as handlers do.
"""

import time

from jobqueue import Handlers


def _sleep(conn, job):
    conn.execute("select %s::int", (job.id,)).fetchone()
    time.sleep(float(job.payload.get("seconds", 1)))


handlers = Handlers({"noop": lambda conn, job: None, "sleep": _sleep})
