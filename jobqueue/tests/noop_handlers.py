"""Handlers for the tests' worker processes (``--handlers noop_handlers``): jobs that do nothing."""

from jobqueue import Handlers

handlers = Handlers({"noop": lambda conn, job: None, "other": lambda conn, job: None})
