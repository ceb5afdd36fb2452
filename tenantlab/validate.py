"""Argument types for the kit's command line: each refuses a bad value in one line, at parse
time, before any work (an output file's directory before a run, an address before a server).

The number types (finite, bounded) are the production worker's (``jobqueue.options``); the
environment's variables are checked in ``settings``.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from jobqueue import ConfigError, check_dsn


def dsn(text: str) -> str:
    """A connection string (argparse names the flag before the message)."""
    try:
        return check_dsn(text, "the value")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def output_file(text: str) -> str:
    """A file to write after a run: its directory must exist now, and it must not be one."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory: name a file to write")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: no directory {path.parent} "
                                         "(create it first)")
    return text


def directory(text: str) -> str:
    """A directory to write into, created if missing: neither it nor a parent may be a file."""
    path = Path(text).expanduser().absolute()
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                where = "" if p == path else f" ({p})"
                raise argparse.ArgumentTypeError(f"{text}{where} is a file, not a directory")
            break
    return text


def listen_address(text: str) -> str:
    """An address of this machine to listen on: IPv4, IPv6 (``::1``, ``[::1]``) or a host name."""
    address = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    reason = ""
    for family in (socket.AF_INET, socket.AF_INET6):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((address, 0))
                return address
            except OSError as e:
                reason = reason or e.strerror or type(e).__name__
    raise argparse.ArgumentTypeError(f"{text!r} is not an address this machine can listen on "
                                     f"({reason}): try 127.0.0.1, ::1 or 0.0.0.0")
