"""The contract every finding module keeps: claim, article, knobs, run, verdict.

A finding module (``tenantlab/experiments/<id>.py``) defines:

- ``CLAIM``: the article's claim in one sentence (or what the kit claims, beyond the article);
- ``ARTICLE``: the article's numbers, a JSON-able dict (``{}`` when the article has none);
- ``Knobs``: a frozen dataclass of this module's :class:`Knobs` kind; its defaults are the
  workshop size and ``Knobs.full()`` the article's sizes; fields made with :func:`knob` carry
  the range a slider offers;
- ``run(knobs=None, *, live=None, progress=None) -> Result``: one live measurement; ``live``,
  when given, has ``update(frame, **latest)``: the rows measured so far as a DataFrame (a
  chart redraws from it), and what the latest step saw beside them (a monitor's sample);
  ``progress(n=1)`` counts steps; ``knobs=None`` is the size TENANTLAB_SIZE asks for;
- ``judge(measured, knobs) -> Verdict``: named checks over the measured values alone, so a
  verdict can be recomputed from a ``reproduce --json`` file.

The registry (``tenantlab.experiments.REGISTRY``) lists the ids once; ``reproduce``, the report,
the notebooks' verdict cells, the explorers and the tests go through it. Jepsen's
``{:valid? ...}`` map is the model for :class:`Verdict`: every check says what was expected,
what was measured, and whether they agree.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

if TYPE_CHECKING:  # imported where used: every `tenantlab` command imports this module
    import pandas as pd

from . import settings
from .errors import TenantlabError

OK, NOT_OK = "✓", "✗"


class KnobError(TenantlabError, ValueError, TypeError):
    """A knob value a finding cannot run with: the one error every finding's knobs raise."""


def knob(default: Any, *, full: Any = None, lo: float | None = None, hi: float | None = None,
         step: float | None = None, label: str = "", choices: tuple[Any, ...] = (),
         at_least: float | None = 0, at_most: float | None = None,
         one_of: tuple[Any, ...] = ()) -> Any:
    """Return a dataclass field for a knob: its workshop default, article size, and slider range.

    ``lo``/``hi``/``step`` make a slider (ints for an int default); ``choices`` a dropdown; a
    bool default a checkbox; a knob with neither range nor choices gets no control.

    What a value may be (checked when the knobs are made, :class:`KnobError` otherwise): of the
    default's type (an int where an int is, a finite number where a float is), from
    ``at_least`` (default 0; None: no bound) to ``at_most``, and one of ``one_of`` or of
    ``choices`` (for a tuple: each of its items).
    """
    meta = {"full": default if full is None else full, "lo": lo, "hi": hi, "step": step,
            "label": label, "choices": choices, "at_least": at_least, "at_most": at_most,
            # A dropdown's choices are values, or (label, value) pairs.
            "one_of": one_of or tuple(c[1] if isinstance(c, tuple) and len(c) == 2 else c
                                      for c in choices)}
    if isinstance(default, list | dict | set):
        raise TypeError("a knob's default must be immutable (use a tuple)")
    return field(default=default, metadata={"knob": meta})


@dataclass(frozen=True)
class Knobs:
    """Base of every finding's knobs: the defaults are the workshop size."""

    #: True when the values are the article's own setup (a verdict then speaks of the article).
    ARTICLE_SETUP: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if meta := f.metadata.get("knob"):
                _validate(f.name, getattr(self, f.name), f.default, meta)

    @classmethod
    def full(cls) -> Self:
        """Return the knobs at the article's sizes."""
        return cls(**{f.name: f.metadata["knob"]["full"] for f in dataclasses.fields(cls)
                      if "knob" in f.metadata})

    @classmethod
    def sized(cls) -> Self:
        """Return the knobs at the size TENANTLAB_SIZE asks for: workshop, or full (the article's).

        The one place a finding's size is decided: every ``run(knobs=None)``, ``reproduce`` and
        the notebooks come here.
        """
        return cls.full() if settings.size() == "full" else cls()

    @classmethod
    def of(cls, full: bool | None = False, **overrides: Any) -> Self:
        """Return workshop (or full) knobs with some values changed; unknown names fail.

        ``full=None``: the size TENANTLAB_SIZE asks for (see :meth:`sized`).
        """
        base = cls.sized() if full is None else cls.full() if full else cls()
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise KnobError(f"unknown knob {unknown[0]!r} for {cls.__qualname__}; "
                            f"valid: {', '.join(sorted(names))}")
        return dataclasses.replace(base, **overrides)

    def is_article_setup(self) -> bool:
        """Return True when every knob is at its workshop or article value.

        Always False for a finding the article never ran (``ARTICLE_SETUP = False``): its
        verdict is judged against the kit's expectation, whatever the knobs.
        """
        return self.ARTICLE_SETUP and self in (type(self)(), type(self).full())

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> Self:
        """Return knobs from their ``as_dict()`` read back from JSON (lists become tuples)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: _tuples(v) for k, v in values.items() if k in names})

    def controls(self) -> list[dict[str, Any]]:
        """Return, per knob with a control, its name, value, label, and range or choices."""
        out = []
        for f in dataclasses.fields(self):
            meta = f.metadata.get("knob")
            if not meta:
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or meta["choices"] or meta["lo"] is not None:
                out.append({"name": f.name, "value": value, **meta,
                            "label": meta["label"] or f.name.replace("_", " ")})
        return out

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Check:
    """One named check: what was expected, what was measured, and whether they agree."""

    name: str
    ok: bool
    expected: str
    measured: str
    #: True when the check reads times (a ratio of durations): a shared machine can move it, so
    #: tests never require it and the browser test reads only the other checks.
    timing: bool = False


@dataclass(frozen=True)
class Verdict:
    """Named checks over one run; valid when every check holds.

    ``against``: what the checks compare with, "the article" for the article's own setup,
    "the expectation" for a run with other knobs (the article never made that run).
    """

    checks: tuple[Check, ...]
    against: str = "the article"

    @classmethod
    def of(cls, checks: Iterable[Check], *, article: bool = True) -> Verdict:
        return cls(tuple(checks), "the article" if article else "the expectation")

    @property
    def valid(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def __bool__(self) -> bool:
        return self.valid

    def headline(self) -> str:
        """Return the one-line verdict: ✓ or ✗ and against what."""
        if self.valid:
            return f"{OK} as {self.against} says"
        failed = [c.name for c in self.checks if not c.ok]
        return f"{NOT_OK} NOT as {self.against} says ({', '.join(failed) or 'nothing measured'})"

    def line(self) -> str:
        """Return the headline and what was measured, as one line of plain text."""
        return f"{self.headline()}: " + "; ".join(
            f"{OK if c.ok else NOT_OK} {c.name}: {c.measured}" for c in self.checks)

    __str__ = line

    def table(self) -> pd.DataFrame:
        """Return one row per check: check, expected, measured, ✓/✗."""
        import pandas as pd

        return pd.DataFrame(
            [{"check": c.name, "expected": c.expected, "measured here": c.measured,
              "": OK if c.ok else NOT_OK} for c in self.checks],
            columns=["check", "expected", "measured here", ""])

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "against": self.against,
                "checks": {c.name: {"ok": c.ok, "expected": c.expected, "measured": c.measured,
                                    "timing": c.timing} for c in self.checks}}

    def _repr_html_(self) -> str:
        colour = "#1b7a2e" if self.valid else "#b3261e"
        rows = "".join(
            f"<tr class='tenantlab-check' data-ok='{int(c.ok)}' data-timing='{int(c.timing)}'>"
            f"<td style='text-align:left'>{html.escape(c.name)}</td>"
            f"<td style='text-align:left'>{html.escape(c.expected)}</td>"
            f"<td style='text-align:left'>{html.escape(c.measured)}</td>"
            f"<td style='color:{'#1b7a2e' if c.ok else '#b3261e'}'>"
            f"{OK if c.ok else NOT_OK}</td></tr>" for c in self.checks)
        return (
            f"<div class='tenantlab-verdict' style='border-left:6px solid {colour};"
            "padding:.4em .8em;max-width:100%;box-sizing:border-box;overflow-wrap:anywhere'>"
            f"<div style='font-weight:bold;color:{colour}'>{html.escape(self.headline())}</div>"
            "<table style='table-layout:fixed;width:100%;border-collapse:collapse'>"
            "<thead><tr><th style='text-align:left;width:22%'>check</th>"
            f"<th style='text-align:left;width:35%'>{html.escape(self.against)}</th>"
            "<th style='text-align:left;width:37%'>measured here</th>"
            "<th style='width:6%'></th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>")

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.line())


@dataclass
class Result:
    """One live run of a finding: its knobs, measured values (JSON), verdict and tables.

    ``measured`` is what ``reproduce --json`` writes; ``table`` the tidy per-variant table a
    notebook shows; ``events`` the workers' event log (a timeline), when workers ran;
    ``data`` anything else the charts draw from (raw series, per-job rows).
    """

    finding: str
    knobs: Knobs
    measured: dict[str, Any]
    verdict: Verdict
    table: pd.DataFrame | None = None
    events: pd.DataFrame | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def reproduced(self) -> bool:
        return self.verdict.valid

    @property
    def summary(self) -> str:
        """Return the verdict's own line: what every check measured, marked ✓ or ✗."""
        return self.verdict.line()

    def _repr_html_(self) -> str:
        return self.verdict._repr_html_()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.verdict.line())


def _validate(name: str, value: Any, default: Any, meta: dict[str, Any]) -> None:
    """Raise KnobError unless value suits the knob: its type, bounds and allowed values."""
    def fail(what: str) -> KnobError:
        return KnobError(f"knob {name} must be {what}, not {value!r}")

    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise fail("true or false")
    elif isinstance(default, int | float) and default is not None:
        whole = isinstance(default, int)
        if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
            raise fail("a whole number" if whole else "a number")
        if not math.isfinite(value):
            raise fail("a finite number")
        lo, hi = meta["at_least"], meta["at_most"]
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise fail(f"at least {lo:g}" if hi is None else f"from {lo:g} to {hi:g}"
                       if lo is not None else f"at most {hi:g}")
    allowed = meta["one_of"]
    if allowed:
        items = value if isinstance(value, tuple) else (value,)
        wrong = [v for v in items if v not in allowed]
        if wrong:
            what = name[:-1] if isinstance(value, tuple) and name.endswith("s") else name
            raise KnobError(f"unknown {what} {wrong[0]!r}; valid: "
                            f"{', '.join(str(a) for a in allowed)}")


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def plain(value: Any) -> Any:
    """Return value as plain JSON data: numpy scalars to Python, whole floats kept as floats."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        return value.item()
    return value


def check(name: str, ok: bool, expected: Any, measured: Any, *, timing: bool = False) -> Check:
    """Return a Check, with expected and measured turned into short text.

    ``timing``: the check reads durations (see :attr:`Check.timing`).
    """
    return Check(name, bool(ok), _text(expected), _text(measured), timing)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value)
    if value is None:
        return "—"
    return str(value)
