"""Your turn: exercises where participants write the fix and the kit checks it.

Each exercise sits in its notebook after the naive run and before the kit's fix. Its starter is
the naive version, runnable as is; ``ex.check(answer)`` runs the finding's own scenario with the
answer (as the worker role, in a scratch database, under a statement timeout) and shows expected
against measured, with a nudge that names the symptom; ``ex.hint()`` gives hints one at a time,
``ex.solution()`` the kit's answer. ``progress()`` shows each exercise: not tried, not yet, ✓.

    from tenantlab import exercises
    ex = exercises.get("leak")
    ex.check(ex.starter)
"""

from __future__ import annotations

import pandas as pd

from ..finding import OK
from . import crash, fair, leak, overrun, poison, rls_jobs
from ._core import NOT_YET, Exercise, Outcome, load_progress, progress_file

__all__ = ["EXERCISES", "Exercise", "Outcome", "get", "progress", "progress_file"]

#: Every exercise by id (the finding's id), in notebook order.
EXERCISES: dict[str, Exercise] = {m.EXERCISE.id: m.EXERCISE
                                  for m in (leak, poison, crash, overrun, rls_jobs, fair)}


def get(key: str) -> Exercise:
    """Return the exercise with this id (``leak``) or notebook number (``01``)."""
    for ex in EXERCISES.values():
        if key in (ex.id, ex.notebook):
            return ex
    valid = ", ".join(f"{ex.id} ({ex.notebook})" for ex in EXERCISES.values())
    raise KeyError(f"no exercise {key!r}; valid: {valid}")


def progress() -> pd.DataFrame:
    """Return one row per exercise: its notebook, title, and not tried / not yet / ✓."""
    done = load_progress()
    rows = []
    for ex in EXERCISES.values():
        entry = done.get(ex.id) or {}
        status = OK if entry.get("correct") else NOT_YET if entry.get("tries") else "not tried"
        rows.append({"notebook": ex.notebook, "exercise": ex.title, "id": ex.id,
                     "tries": int(entry.get("tries", 0)), "status": status})
    return pd.DataFrame(rows, columns=["notebook", "exercise", "id", "tries", "status"])
