"""Log what becomes of each job, for the people who run the workers: text or JSON lines.

What is logged, by default (WARNING): a failed attempt, with its traceback, and the retry to
come; a dead job at ERROR; lost servers, lost leases, abandoned jobs. With ``-v`` (INFO) also
one line per done, fenced or cancelled job. Every job's record carries its fields (``job``,
``kind``, ``tenant``, ``attempt``, ``worker``, ``outcome``, ``error``) as ``extra``; the JSON
format (``--log-format json``) writes them, with the time, level, logger, message and
traceback, as one object per line for a log shipper.

The job lines go to the logger ``<package>.jobs`` (``jobqueue.jobs`` in an exported copy), the
rest to ``<package>``: an application can raise or lower the first alone.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from datetime import UTC, datetime
from typing import Any, TextIO

APP = (__package__ or "jobqueue").split(".")[0]
#: The per-job lines (done, failed, dead, fenced, cancelled).
jobs_log = logging.getLogger(f"{APP}.jobs")

FORMATS = ("text", "json")
#: The fields a job's record carries (``extra``), in the JSON object's order.
FIELDS = ("job", "kind", "tenant", "attempt", "worker", "outcome", "error")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object on one line (the traceback as a string field)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                out[name] = value if isinstance(value, int | float | str | bool) else str(value)
        if record.exc_info and record.exc_info[1] is not None:
            out["traceback"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(out, ensure_ascii=False)


def setup(*, verbose: bool = False, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Log to `stream` (stderr): WARNING and up, every job too when `verbose`; text or JSON."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler],
                        force=True)
    handler.addFilter(_pipeline_teardown)


def _pipeline_teardown(record: logging.LogRecord) -> bool:
    """Drop psycopg's "error ignored terminating <psycopg.Pipeline ...>": it repeats, in a
    repr, the error the worker reports (and acts on) itself, when a statement fails inside a
    pipeline block."""
    return not (record.name == "psycopg"
                and record.getMessage().startswith("error ignored terminating <psycopg.Pipeline"))


def fields(claim: Any, outcome: str, error: str | None = None) -> dict[str, Any]:
    """Return a job's fields for a record's ``extra``."""
    return {"job": claim.id, "kind": claim.kind, "tenant": str(claim.tenant_id),
            "attempt": claim.attempt, "worker": claim.worker, "outcome": outcome,
            "error": error}


def done(claim: Any) -> None:
    """Log a job done (INFO: only with -v; cheap when off)."""
    if jobs_log.isEnabledFor(logging.INFO):
        jobs_log.info("job %s %s (tenant %s) done at attempt %s", claim.id, claim.kind,
                      claim.tenant_id, claim.attempt, extra=fields(claim, "done"))


def fenced(claim: Any, outcome: str, why: str) -> None:
    """Log a job fenced out, or cancelled while it ran (INFO)."""
    if jobs_log.isEnabledFor(logging.INFO):
        jobs_log.info("job %s %s (tenant %s) attempt %s %s: %s", claim.id, claim.kind,
                      claim.tenant_id, claim.attempt, outcome, why,
                      extra=fields(claim, outcome, why))


def failed(claim: Any, status: str, error: str, exc: BaseException | None,
           retry_at: Any = None) -> None:
    """Log a failed attempt (WARNING) or a dead job (ERROR), with the traceback."""
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    first = error.splitlines()[0] if error else ""
    if status == "dead":
        jobs_log.error("job %s %s (tenant %s) dead after attempt %s: %s", claim.id, claim.kind,
                       claim.tenant_id, claim.attempt, first, exc_info=exc_info,
                       extra=fields(claim, "dead", error))
        return
    when = ""
    if isinstance(retry_at, datetime) and retry_at.tzinfo is not None:
        # The server's clock against this one: close enough to tell "now" from "in 5 minutes".
        when = f", retry in {max((retry_at - datetime.now(UTC)).total_seconds(), 0):.1f} s"
    jobs_log.warning("job %s %s (tenant %s) attempt %s failed%s: %s", claim.id, claim.kind,
                     claim.tenant_id, claim.attempt, when, first, exc_info=exc_info,
                     extra=fields(claim, "failed", error))
