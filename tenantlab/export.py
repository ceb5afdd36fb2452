"""Copy the ``jobqueue`` package into a directory, for an application to vendor.

``export(DIR, name="jobqueue")`` copies the installed ``jobqueue`` package (its modules, named
queries and migrations, ``py.typed``) to ``DIR/NAME`` as it is, with the distribution's README
beside them. Every import inside the package is relative, so the copy works under any name:
nothing is renamed. ``pip install ./jobqueue`` is the other way to take it.

It never deletes what it did not write. ``DIR/NAME/.exported-from-tenantlab`` lists the files
an export wrote; a later export removes those and only those. A ``DIR/NAME`` that is not empty
and holds no such list is someone's code: refused, unless ``force`` (then same-named files are
overwritten and nothing is deleted).
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import jobqueue

HERE = Path(jobqueue.__file__).resolve().parent
#: What the package is made of: modules, named queries, migrations (read at run time).
FILES = ("*.py", "py.typed", "sql/*.sql", "migrations/*.sql")
MARKER = ".exported-from-tenantlab"


class ExportRefused(ValueError):
    """The target holds files this export did not write: they are not ours to replace."""


def readme() -> str:
    """Return the distribution's README (the checkout's file, else the installed metadata's)."""
    for dist in (HERE.parent.parent, HERE.parent):  # jobqueue/src/jobqueue, or a flat layout
        if (dist / "pyproject.toml").is_file() and (dist / "README.md").is_file():
            return (dist / "README.md").read_text()
    return str(metadata.metadata("jobqueue").get_payload())  # type: ignore[attr-defined]



def export(target: str | Path, name: str = "jobqueue", *, force: bool = False) -> Path:
    """Write the package as `name` into directory `target`; return the package's directory.

    Raises ExportRefused when ``target/name`` holds files an earlier export did not write
    (unless `force`), ValueError for a name that is not a Python identifier.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"package name must be a Python identifier, not {name!r}")
    dest = Path(target) / name
    if dest.exists() and not dest.is_dir():
        raise ExportRefused(f"{dest} is a file, not a package directory: choose another "
                            "--name or DIR")
    earlier = written_before(dest)
    if earlier is None and dest.is_dir() and any(dest.iterdir()) and not force:
        raise ExportRefused(f"{dest} is not empty and is not an earlier export (no {MARKER}): "
                            "choose another --name or DIR, or pass --force to write into it "
                            "(same-named files overwritten, nothing deleted)")
    for listed in earlier or []:
        _remove(dest, listed)
    wrote: list[str] = []
    for pattern in FILES:
        for src in sorted(HERE.glob(pattern)):
            out = dest / src.relative_to(HERE)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(src.read_bytes())
            wrote.append(src.relative_to(HERE).as_posix())
    (dest / "README.md").write_text(readme())
    wrote.append("README.md")
    # Written last: an export cut short leaves no list, so the next one asks for --force
    # rather than trusting a list that does not match what is there.
    (dest / MARKER).write_text("# Written by `tenantlab export-worker` from jobqueue; the next "
                               "export replaces these files (and no others).\n"
                               + "".join(f"{rel}\n" for rel in wrote))
    return dest


def written_before(dest: Path) -> list[str] | None:
    """Return the files an earlier export wrote into `dest`, or None if it was not one."""
    marker = dest / MARKER
    if not marker.is_file():
        return None
    return [line.strip() for line in marker.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def _remove(dest: Path, rel: str) -> None:
    """Remove one file an earlier export listed, and its directories once they are empty."""
    path = (dest / rel).resolve()
    root = dest.resolve()
    if not path.is_relative_to(root) or path == root:
        return  # a list edited to point outside the package: not ours
    if path.is_file():
        path.unlink()
    parent = path.parent
    while parent != root and parent.is_relative_to(root) and parent.is_dir() \
            and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
