"""Write the README's notebook timing table from the notebook tests' record.

    .venv/bin/python -m pytest -m notebook     # records test-output/notebook-seconds.json
    python tools/notebook_timings.py            # rewrites README.md between the markers

The table is what the last test run measured, top to bottom in a fresh kernel at workshop size:
never typed by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import readme_section

ROOT = Path(__file__).resolve().parent.parent
TIMINGS = ROOT / "test-output" / "notebook-seconds.json"
BUDGET = 60  # seconds a notebook may take at workshop size


def table(times: dict[str, float]) -> str:
    rows = ["| notebook | seconds | within 60 s |", "|---|---|---|"]
    for name, seconds in sorted(times.items()):
        title = name.removesuffix(".ipynb").replace("-", " ", 1).replace("-", " ")
        rows.append(f"| {title} | {seconds:.0f} | {'yes' if seconds <= BUDGET else '**no**'} |")
    cores = os.cpu_count()
    return (f"Measured by the notebook tests ({cores} cores, {platform.machine()}), each notebook "
            f"top to bottom in a fresh kernel at workshop size:\n\n" + "\n".join(rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--print", action="store_true")
    args = p.parse_args(argv)
    if not TIMINGS.exists():
        print(f"{TIMINGS} missing: run the notebook tests first (pytest -m notebook)",
              file=sys.stderr)
        return 1
    text = table(json.loads(TIMINGS.read_text()))
    if args.print:
        print(text)
        return 0
    return readme_section.write("notebook-timings", text)


if __name__ == "__main__":
    sys.exit(main())
