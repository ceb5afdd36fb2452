"""Run the application's code around each job: before its start, after its finish, on failure.

Subclass ``Hooks`` and override what you need (each method does nothing by default), then pass
an instance to ``Worker(..., hooks=...)`` or ``Leased(..., hooks=...)``, or name it ``hooks`` in
the handlers module the command line loads (``--handlers myapp.jobs`` uses ``myapp.jobs.hooks``).

Every job a worker claims and runs gets exactly one of ``after_finish`` and ``on_failure``:

- ``before_start(claim)``: the job was started (the fence passed, the tenant is set locally) and
  its handler is about to run, inside the job's transaction. An exception here is the job's own:
  its attempt fails, counted, as if the handler had raised it.
- ``after_finish(claim, outcome)``: the handler returned and the finish was decided, after the
  commit: ``outcome.status`` is ``done``, or ``fenced``/``cancelled`` when the attempt no longer
  owned the job (then nothing it wrote committed, and ``before_start`` may not have run).
- ``on_failure(claim, outcome, error)``: the handler (or ``before_start``) raised ``error``; the
  failure is recorded: ``outcome.status`` is ``queued`` (a retry after the backoff), ``dead``,
  or ``fenced`` when the attempt no longer owned the job.

The last two run after the outcome is committed, so they cannot change it: an exception they
raise is logged (with its traceback) and the worker goes on. Keep them fast: they run on the
worker's thread, between its jobs.
"""

from __future__ import annotations

import logging

from .jobs import Claim, Outcome

log = logging.getLogger((__package__ or "jobqueue").split(".")[0])

__all__ = ["Hooks"]


class Hooks:
    """Code around each job (a metrics counter, a tracing span); every method is optional."""

    def before_start(self, claim: Claim) -> None:
        """Run before the handler, inside the job's transaction; raising fails the attempt."""

    def after_finish(self, claim: Claim, outcome: Outcome) -> None:
        """Run after the job's finish committed (``done``) or was fenced out."""

    def on_failure(self, claim: Claim, outcome: Outcome, error: BaseException) -> None:
        """Run after a failed attempt was recorded (``queued`` for a retry, ``dead``, ``fenced``)."""


#: The hooks of a worker given none: nothing runs.
NO_HOOKS = Hooks()


def after_finish(hooks: Hooks, claim: Claim, outcome: Outcome) -> None:
    """Call ``hooks.after_finish``; log what it raises (the outcome is already committed)."""
    try:
        hooks.after_finish(claim, outcome)
    except Exception:
        log.exception("job %s: the after_finish hook failed (the job's outcome stands)", claim.id)


def on_failure(hooks: Hooks, claim: Claim, outcome: Outcome, error: BaseException) -> None:
    """Call ``hooks.on_failure``; log what it raises (the failure is already recorded)."""
    try:
        hooks.on_failure(claim, outcome, error)
    except Exception:
        log.exception("job %s: the on_failure hook failed (the failure stands)", claim.id)
