"""Worker options, defined once: the dataclass's fields generate the command line's flags.

Each field carries its help and its parser in ``metadata``; ``add_flags`` turns the fields of
any options dataclass (a subclass may add its own) into argparse flags, ``from_args`` reads them
back, ``to_argv`` writes the flags that start a worker with these options.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .enqueue import parse_queues
from .fair import Fair
from .fair import flag as fair_flag
from .heartbeat import AUTO, check, interval_for, runtime_for
from .jobs import MAX_COUNT, MAX_SECONDS, ConfigError
from .preflight import check_dsn
from .tenant import DEFAULT_TENANT_SETTING, check_setting

__all__ = ["Parser", "WorkerOptions", "add_flags", "count", "from_args", "number", "option", "seconds",
           "to_argv"]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: what is wrong, and where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def number(kind: type, what: str, *, zero: bool = False, unit: str = "",
           most: float | None = None) -> Callable[[str], Any]:
    """Return an argparse type that accepts a finite positive number (or 0) up to `most`."""
    whole = "whole " if kind is int else ""
    valid = f"{what} must be {'0 or ' if zero else ''}a positive {whole}number{unit}"
    most = (MAX_SECONDS if unit else MAX_COUNT) if most is None else most

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{valid}, not {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{valid}, not {text!r} (not a finite number)")
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"{valid}, not {text!r}")
        if value > most:
            raise argparse.ArgumentTypeError(f"{what} must be at most {most:,}{unit.removeprefix(' of')}, "
                                             f"not {text!r}")
        return value
    return parse


def seconds(what: str, *, zero: bool = False, most: float | None = None) -> Callable[[str], Any]:
    return number(float, what, zero=zero, unit=" of seconds", most=most)


def count(what: str, *, most: int | None = None) -> Callable[[str], Any]:
    return number(int, what, most=most)


def queues_flag(text: str) -> str:
    """Parse ``--queues a,b`` for argparse: the queues, each once, comma-separated."""
    try:
        return ",".join(parse_queues(text))
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def setting_flag(text: str) -> str:
    """Parse --tenant-setting: a custom setting's name (``prefix.name``)."""
    try:
        return check_setting(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def option(default: Any, help: str, *, parse: Callable[[str], Any] | None = None,
           flag: str | None = None, choices: list[str] | None = None) -> Any:
    """Declare one option: its default, its help line, how its flag's value is parsed."""
    return field(default=default, metadata={"help": help, "parse": parse, "flag": flag,
                                            "choices": choices})


@dataclass
class WorkerOptions:
    """What one worker process does: the flags of ``jobqueue``."""

    lease: float = option(30.0, "lease in seconds: how long a claim is exclusive",
                          parse=seconds("lease"))
    backoff: float = option(1.0, "first retry delay in seconds, doubling per attempt; 0 = off",
                            parse=seconds("backoff", zero=True))
    heartbeat: float | None = option(
        None, "extend the leases every S seconds while jobs run, S < lease (default: a third "
              "of the lease; 0 = off: a job longer than its lease then runs again)",
        parse=seconds("heartbeat", zero=True))
    max_runtime: float | None = option(
        None, "the watchdog: after S seconds a job's lease is no longer extended and its "
              "attempt is failed (counted; logged at ERROR) while its handler, not interrupted, "
              "is fenced out (default: 3600 with a heartbeat; 0 = off)",
        parse=seconds("max-runtime", zero=True))
    batch: int = option(1, "claim up to N jobs in one statement, each with its own attempt "
                           "and lease, run one after another", parse=count("batch"))
    batch_commit: bool = option(
        False, "with --batch: run the batch's jobs in one transaction, each in a savepoint of its "
               "own, and finish them in one commit: one fsync per batch; but a crash loses the "
               "whole batch's finishes (its jobs run again, counted), and its jobs' rows are "
               "locked from the batch's start (each fence held to the commit), which takes a "
               "transaction id: the batch holds the VACUUM horizon until it commits, and a "
               "cancel of its jobs waits for it")
    lossy_claim: bool = option(
        False, "commit a claim made on its own without waiting for its WAL flush (a claim sent "
               "with a finish or in a batch commits with it, durably): faster, but a server "
               "crash right after such a claim can lose its count (one attempt number handed "
               "out twice); nothing else is committed lossily")
    poll: float = option(0.5, "seconds between polls when idle (a NOTIFY wakes it sooner)",
                         parse=seconds("poll"))
    listen: bool = option(True, "do not LISTEN for enqueues: poll only", flag="--no-listen")
    pooler: bool = option(
        False, "the DSN leads to a transaction pooler (PgBouncer in transaction mode): no "
               "prepared statements on any of the worker's connections, no LISTEN through it "
               "(wake-ups from --listen-dsn, else a poll every --poll seconds)")
    listen_dsn: str | None = option(
        None, "LISTEN for enqueues on a connection of its own to this DSN (PostgreSQL itself, "
              "not the pooler; default: $JOBQUEUE_LISTEN_DSN); the work stays on --dsn")
    max_outage: float | None = option(
        None, "exit (status 3) after S seconds without the server (default: retry forever)",
        parse=seconds("max-outage"))
    max_jobs: int | None = option(None, "stop after N claims", parse=count("max-jobs"))
    until_empty: bool = option(False, "stop when the queue is empty")
    name: str | None = option(None, "worker name in job_runs and the log")
    queues: str = option(
        "default", "serve these queues, comma-separated (default: 'default' only: a job put in "
                   "another queue runs only on the workers that name it)", parse=queues_flag)
    fair: str | None = option(
        None, "claim fairly across tenants: round-robin (the oldest job of the tenant served "
              "least recently) or limit=N (skip tenants already running N jobs); default FIFO",
        parse=fair_flag)
    tenant_setting: str = option(
        DEFAULT_TENANT_SETTING, "the setting each job's tenant is set to, locally, for its "
                                "transaction: what your row-level security policies read "
                                "(a custom setting, prefix.name)", parse=setting_flag)

    def __post_init__(self) -> None:
        for name in ("lease", "backoff", "heartbeat", "max_runtime", "poll", "max_outage"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value <= MAX_SECONDS):
                raise ConfigError(f"{name.replace('_', '-')} must be a finite number of seconds "
                                  f"up to {MAX_SECONDS:,}, not {value}")
        if not self.lease > 0:
            raise ConfigError(f"lease must be a positive number of seconds, not {self.lease}")
        if self.backoff < 0:
            raise ConfigError(f"backoff must be 0 (off) or positive seconds, not {self.backoff}")
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ConfigError(f"max-jobs must be at least 1, not {self.max_jobs}")
        if self.batch < 1:
            raise ConfigError(f"batch must be at least 1, not {self.batch}")
        if not self.poll > 0:
            raise ConfigError(f"poll must be a positive number of seconds, not {self.poll}")
        if self.fair is not None:
            self.fair = str(Fair.parse(self.fair))
            if self.lossy_claim:
                raise ConfigError("lossy-claim has no fair variant: use one or the other")
        interval = interval_for(self.lease, self.heartbeat_setting())
        check(self.lease, interval, runtime_for(interval, self.max_runtime_setting()))
        if not isinstance(self.queues, str):
            self.queues = ",".join(self.queues)  # a list of queues, as the flag writes it
        self.queues = ",".join(parse_queues(self.queues))
        check_setting(self.tenant_setting)
        if self.listen_dsn is not None:
            if not self.listen:
                raise ConfigError("listen-dsn is where the worker listens; --no-listen says it "
                                  "does not: use one or the other")
            check_dsn(self.listen_dsn, "listen-dsn")

    def max_runtime_setting(self) -> float | str | None:
        """Return the maximum runtime as ``Leased`` takes it: AUTO (the default), seconds, or
        None (off)."""
        if self.max_runtime is None:
            return AUTO
        return self.max_runtime or None

    def heartbeat_setting(self) -> float | str | None:
        """Return the heartbeat as ``Leased`` takes it: AUTO (the default), seconds, or None (off)."""
        if self.heartbeat is None:
            return AUTO
        return self.heartbeat or None


def _flag(f: dataclasses.Field[Any]) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, cls: type = WorkerOptions) -> None:
    """Add one flag per field of the options dataclass `cls`."""
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue
        if f.type in (bool, "bool"):
            action = "store_false" if f.default else "store_true"
            parser.add_argument(_flag(f), dest=f.name, action=action, help=f.metadata["help"])
            continue
        kwargs: dict[str, Any] = {"default": f.default, "help": f.metadata["help"]}
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
        if f.metadata.get("parse"):
            kwargs["type"] = f.metadata["parse"]
        parser.add_argument(_flag(f), dest=f.name, **kwargs)


def from_args(cls: type, args: argparse.Namespace) -> Any:
    """Build the options dataclass `cls` from parsed flags."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
                  if hasattr(args, f.name)})


def to_argv(options: Any) -> list[str]:
    """Return the flags that give a worker these options (defaults left out)."""
    argv: list[str] = []
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if "help" not in f.metadata or value == f.default:
            continue
        if isinstance(value, bool):
            argv.append(_flag(f))
        elif value is not None:
            argv += [_flag(f), str(value)]
    return argv
