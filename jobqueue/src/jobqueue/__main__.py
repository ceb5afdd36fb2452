"""Run ``python -m jobqueue``: a worker by default (see cli.py)."""

from .cli import main

raise SystemExit(main())
