"""Run a participant's answer in a sandbox, judge it by the database's state, show the result.

An answer is SQL text, and untrusted: it runs on a connection that logs in as a role made for
this check, with only the worker role's grants (08: the owner of the jobs table), in a scratch
database cloned for the check; both are dropped afterwards, also when the cell is interrupted
(``_sandbox``). Parameters (``%(tenant)s``, ``%(id)s``, ...) are bound client-side as literals,
so ``SET LOCAL app.tenant = %(tenant)s`` works as well as ``set_config``. The judge reads the
outcome on its own admin connection: the jobs' states after each statement the answer ran,
over several runs that vary the attempt numbers, the budgets, the positions and the tenants,
never a count the answer returns. Afterwards the catalog facts (policies, row security,
grants, columns, rules, roles, role and database settings) are compared with before.
"""

from __future__ import annotations

import html
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .. import settings
from ..finding import OK, Check, check
from ..queries import q
from ._sandbox import Sandbox, sandbox

log = logging.getLogger("tenantlab")

NOT_YET = "not yet"
COULD_NOT_CHECK = "could not check"
#: Every statement of an answer stops after this long (a loop, a lock wait, a pg_sleep).
STATEMENT_TIMEOUT_MS = 3000
LOCK_TIMEOUT_MS = 1000
OPTIONS = (f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={LOCK_TIMEOUT_MS} "
           "-c idle_in_transaction_session_timeout=20000")
#: The judge's admin sessions never evaluate an answer's policy as the admin: with row
#: security off, a policy that would apply is an error instead (a superuser ignores policies).
ADMIN_OPTIONS = "-c row_security=off"
#: An answer longer than this is refused before anything runs (a pasted dump, a generated loop).
MAX_ANSWER_BYTES = 1_000_000


class AnswerFailed(Exception):
    """The answer could not run (syntax, timeout, a missing parameter, an error): one line."""

    def __init__(self, line: str, constraint: str | None = None) -> None:
        super().__init__(line)
        self.constraint = constraint


class Unusable(AnswerFailed):
    """The kit could not check the answer: not text, not UTF-8, a NUL byte, a wrong shape."""


class Refused(Exception):
    """The answer changed the rules the check runs by (a grant, a policy, other jobs)."""


def strip_comments(text: str) -> str:
    """Return text without -- and /* */ comments."""
    return re.sub(r"--[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def answer_text(answer: object) -> str:
    """Return the answer as SQL text, or raise Unusable in one line (what was wrong, what to do).

    A str, or what ``ex.solution()`` / ``ex.hint()`` return; a byte-order mark is dropped.
    """
    if hasattr(answer, "body") and isinstance(answer.body, str):  # a Text: ex.solution()
        answer = answer.body
    if isinstance(answer, bytes | bytearray):
        answer = decode_answer(bytes(answer))
    if not isinstance(answer, str):
        raise Unusable(f"your answer is a {type(answer).__name__}, not text: write the SQL as a "
                       'string, e.g. answer = """select ..."""')
    if len(answer.encode("utf-8", "surrogatepass")) > MAX_ANSWER_BYTES:
        raise Unusable(f"your answer is longer than {MAX_ANSWER_BYTES // 1_000_000} MB: an "
                       "exercise's answer is a few statements")
    if "\x00" in answer:
        raise Unusable(f"your answer holds a NUL byte (character {answer.index(chr(0)) + 1}): "
                       "PostgreSQL would cut the text there; save it as plain text")
    return answer.removeprefix("\ufeff")


def decode_answer(data: bytes) -> str:
    """Return an answer file's text: UTF-8 with or without a byte-order mark; else Unusable."""
    if len(data) > MAX_ANSWER_BYTES:
        raise Unusable(f"the answer is {len(data):,} bytes, more than "
                       f"{MAX_ANSWER_BYTES // 1_000_000} MB: an exercise's answer is a few "
                       "statements")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise Unusable(f"the answer is not UTF-8 (byte 0x{data[e.start]:02x} at position "
                       f"{e.start + 1}): save it as UTF-8") from None


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def run_answer(conn: psycopg.Connection, text: str, params: dict[str, Any],
               what: str = "your answer") -> psycopg.Cursor[Any]:
    """Run the answer's statements on conn; return the cursor at the last result.

    Parameters are bound client-side (as literals): several statements may run at once.
    """
    cur: psycopg.Cursor[Any] = psycopg.ClientCursor(conn)
    # The server's timeout, and a client-side one: an answer may lift its own.
    watchdog = threading.Timer(STATEMENT_TIMEOUT_MS / 1000 + 1, conn.cancel_safe)
    watchdog.daemon = True
    watchdog.start()
    try:
        cur.execute(text.strip().rstrip(";") or "select", params)
        while cur.nextset():
            pass
    except psycopg.errors.QueryCanceled as e:
        raise AnswerFailed(f"{what} ran longer than {STATEMENT_TIMEOUT_MS / 1000:g} s and was "
                           f"stopped (statement timeout): a loop, a lock wait?") from e
    except psycopg.errors.LockNotAvailable as e:
        raise AnswerFailed(f"{what} waited for a lock longer than "
                           f"{LOCK_TIMEOUT_MS / 1000:g} s and was stopped") from e
    except psycopg.errors.SyntaxError as e:
        raise AnswerFailed(f"syntax error in {what}: {one_line(e)}") from e
    except psycopg.errors.InsufficientPrivilege as e:
        raise AnswerFailed(f"{what} was refused by the database: {one_line(e)} (it runs as a "
                           "role with only the rights this exercise needs)") from e
    except psycopg.OperationalError as e:
        if conn.broken or conn.closed:
            raise AnswerFailed(f"{what} ended its own connection: {one_line(e)}") from e
        raise AnswerFailed(f"{what} failed: {one_line(e)}") from e
    except psycopg.Error as e:
        if e.sqlstate is None:  # psycopg's own: a parameter missing, a lone % in the text
            raise AnswerFailed(f"{what} uses a parameter it is not given: {one_line(e)} "
                               "(write a literal % as %%)") from e
        constraint = getattr(e.diag, "constraint_name", None)
        raise AnswerFailed(f"{what} failed: {one_line(e)}", constraint) from e
    finally:
        watchdog.cancel()
    return cur


def rows_of(cur: psycopg.Cursor[Any]) -> list[dict[str, Any]]:
    """Return the answer's last result as dicts ([] when it returned no rows)."""
    if cur.description is None:
        return []
    names = [c.name for c in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


class Rules:
    """The catalog facts before an answer ran; ``changed()`` names what differs afterwards.

    Facts of the scratch database (policies, row security, grants, columns, constraints,
    functions, triggers, rules) and of the cluster (roles and memberships, role settings,
    database settings), other checks' own roles and databases left out: on a server a room
    shares, those come and go while this check runs.
    """

    def __init__(self, sb: Sandbox, may_change: tuple[str, ...] = ()) -> None:
        self.sb = sb
        self.may_change = may_change
        self.before = self._facts()

    def _facts(self) -> set[str]:
        with self.sb.connect("admin", "exercise rules", autocommit=True,
                             options=ADMIN_OPTIONS) as conn:
            return {r[0] for r in conn.execute(q("exercise_rules"),
                                               {"mine": list(self.sb.roles())})
                    if not r[0].startswith(self.may_change)}

    def changed(self) -> str | None:
        after = self._facts()
        gone, new = sorted(self.before - after), sorted(after - self.before)
        if not gone and not new:
            return None
        return f"now: {new[0]}" if new else f"was: {gone[0]}"


class Jobs:
    """Every job's state as admin: which jobs did a statement change, and how?"""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.last = self.now()

    def now(self) -> dict[int, dict[str, Any]]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            return {r["id"]: r for r in cur.execute(q("exercise_jobs"))}

    def changed(self) -> set[int]:
        """Return the ids of the jobs changed since the last call (or since the start)."""
        now = self.now()
        ids = {i for i in now.keys() | self.last.keys() if now.get(i) != self.last.get(i)}
        self.last = now
        return ids

    def only(self, allowed: set[int], what: str) -> None:
        """Raise Refused when the statement changed a job other than those it took."""
        other = sorted(self.changed() - allowed)
        if other:
            raise Refused(f"{what} changed job {other[0]}, which it did not take: a claim or a "
                          "finish changes only its own jobs (no editing the jobs table by hand)")

    def state(self, job: int) -> dict[str, Any]:
        return self.last.get(job) or self.now()[job]

    def claim(self, took: list[tuple[int, int]], what: str, committed: bool) -> str | None:
        """Check what a claim did, by the table: return a nudge, or None when it did right.

        A claim takes jobs that may run (not running under a live lease, not final), and
        leaves each 'running', its attempts counted once, under a lease, the rest as it was;
        it returns the attempt it counted. Read only once the claim committed (a claim in an
        open transaction is judged by what happens to that transaction).
        """
        before = self.last
        self.only({job for job, _ in took}, what)
        for job, attempt in took:
            old, new = before.get(job), self.last.get(job)
            if old is None or new is None:
                raise Unusable(f"{what} returned id {job}, which is no job in the queue: a "
                               "claim returns the id of the job it took")
            if old["status"] in ("done", "dead"):
                return (f"{what} took job {job}, which was already {old['status']}: a claim "
                        "takes only jobs that may still run")
            if old["status"] == "running" and old["leased"]:
                return (f"{what} took job {job} while another worker's lease on it still ran: "
                        "a claim skips running jobs until their lease runs out")
            if not committed:
                continue
            moved = [k for k in ("tenant_id", "kind", "max_attempts", "payload")
                     if old[k] != new[k]]
            if moved:
                return (f"{what} changed job {job}'s {moved[0]}: a claim marks the job running, "
                        "counts the attempt and sets the lease, nothing else")
            if new["attempts"] != old["attempts"] + 1:
                return (f"{what} moved job {job}'s attempts from {old['attempts']} to "
                        f"{new['attempts']}: a claim counts one attempt (attempts + 1), so "
                        "that every execution is counted once")
            if new["status"] != "running":
                return (f"{what} left job {job} '{new['status']}': does your claim mark the job "
                        "'running', as the fenced fail and finish expect? (A final status is "
                        "theirs to write, after the work.)")
            if not new["leased"]:
                return (f"{what} left job {job} running without a lease (locked_until): "
                        "while it runs, another worker may take it, and after a crash nothing "
                        "says when it may run again. Set locked_until from %(lease)s")
            if attempt != new["attempts"]:
                return (f"{what} returned attempt {attempt} for job {job}, whose attempts now "
                        f"say {new['attempts']}: return the attempt it counted (returning "
                        "attempts as attempt)")
        return None

    def expire(self) -> None:
        """Let time pass for the running jobs: their leases run out (no waiting)."""
        self.conn.execute(q("exercise_expire_leases"))
        self.changed()


@dataclass(frozen=True)
class Outcome:
    """One check of an answer: the named checks, and a nudge naming the symptom when not yet."""

    id: str
    title: str
    checks: tuple[Check, ...] = ()
    nudge: str = ""
    error: str = ""
    solution: str | None = None
    #: False when the kit could not check the answer (not text, a wrong shape): never "not yet".
    checked: bool = True

    @property
    def correct(self) -> bool:
        return (self.checked and not self.error and bool(self.checks)
                and all(c.ok for c in self.checks))

    def __bool__(self) -> bool:
        return self.correct

    def headline(self) -> str:
        if self.correct:
            return f"{OK} {self.title}: your answer does it"
        return f"{NOT_YET if self.checked else COULD_NOT_CHECK}: {self.error or self.nudge}"

    def line(self) -> str:
        return self.headline()

    __str__ = line

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "correct": self.correct,
                "checks": [{"name": c.name, "expected": c.expected, "measured": c.measured,
                            "ok": c.ok} for c in self.checks],
                "nudge": "" if self.correct else (self.error or self.nudge),
                "checked": self.checked}

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        lines = [self.headline()]
        lines += [f"  {OK if c.ok else NOT_YET + ':'} {c.name}: expected {c.expected}; "
                  f"measured {c.measured}" for c in self.checks]
        p.text("\n".join(lines))

    def _repr_html_(self) -> str:
        colour = "#1b7a2e" if self.correct else "#8a5a00"
        rows = "".join(_check_row(c) for c in self.checks)
        table = (
            "<table style='table-layout:fixed;width:100%;border-collapse:collapse'>"
            "<thead><tr><th style='text-align:left;width:24%'>check</th>"
            "<th style='text-align:left;width:30%'>expected</th>"
            "<th style='text-align:left;width:34%'>measured with your answer</th>"
            f"<th style='width:12%'></th></tr></thead><tbody>{rows}</tbody></table>"
            if self.checks else "")
        more = ("" if self.correct else
                "<div style='color:#555'>More help: <code>ex.hint()</code>, one hint at a time; "
                "<code>ex.solution()</code> shows the kit's answer.</div>")
        solution = ("" if self.solution is None else
                    "<details open class='tenantlab-solution'><summary>the kit's answer "
                    f"(instructor view)</summary><pre style='white-space:pre-wrap'>"
                    f"{html.escape(self.solution)}</pre></details>")
        return (
            f"<div class='tenantlab-exercise' data-correct='{int(self.correct)}' "
            f"style='border-left:6px dashed {colour};padding:.4em .8em;max-width:100%;"
            "box-sizing:border-box;overflow-wrap:anywhere'>"
            f"<div style='font-weight:bold;color:{colour}'>{html.escape(self.headline())}</div>"
            f"{table}{more}{solution}</div>")


def _check_row(c: Check) -> str:
    """Return one check's table row: name, expected, measured (escaped), then ✓ or not yet."""
    cells = "".join(f"<td style='text-align:left'>{html.escape(text)}</td>"
                    for text in (c.name, c.expected, c.measured))
    mark = (f"<td style='color:#1b7a2e'>{OK}</td>" if c.ok
            else f"<td style='color:#8a5a00'>{NOT_YET}</td>")
    return f"<tr class='tenantlab-exercise-check' data-ok='{int(c.ok)}'>{cells}{mark}</tr>"


@dataclass(frozen=True)
class Text:
    """A hint or an answer text, shown as is (a notebook renders it, print() too)."""

    title: str
    body: str
    code: bool = False

    def __str__(self) -> str:
        return self.body

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(f"{self.title}\n{self.body}")

    def _repr_html_(self) -> str:
        body = (f"<pre style='white-space:pre-wrap'>{html.escape(self.body)}</pre>" if self.code
                else f"<div>{html.escape(self.body)}</div>")
        return (f"<div class='tenantlab-exercise-text' style='border-left:4px solid #888;"
                f"padding:.3em .8em;max-width:100%;box-sizing:border-box;overflow-wrap:anywhere'>"
                f"<b>{html.escape(self.title)}</b>{body}</div>")


Scenario = Callable[[str, Sandbox], tuple[list[Check], str]]


@dataclass
class Exercise:
    """One exercise: the starter, the scenario that judges an answer, hints, the kit's answer.

    ``scenario(answer, sandbox)`` runs the finding's scenario with the answer (several runs)
    and returns the checks and the nudge for the first one that failed. ``owner``: the answer
    runs as the owner of the jobs table (08's migration); ``may_change`` names the catalog
    facts it may change. ``screen`` reads the answer's shape before anything runs (a script
    without its ``-- work`` line), never to keep the server safe.
    """

    id: str
    notebook: str
    title: str
    task: str
    starter: str
    answer: str
    hints: tuple[str, ...]
    scenario: Scenario
    may_change: tuple[str, ...] = ()
    owner: bool = False
    screen: Callable[[str], None] | None = None
    _hints_shown: int = field(default=0, repr=False)
    _last: Outcome | None = field(default=None, repr=False)

    def check(self, answer: object) -> Outcome:
        """Run the finding's scenario with your answer and say what it measured."""
        outcome = judge(self, answer)
        if outcome.checked:
            record(self.id, outcome.correct)
            self._last = outcome
        return outcome

    def hint(self) -> Text:
        """Show the next hint (one at a time); the first reads what your last check showed."""
        n = min(self._hints_shown, len(self.hints) - 1)
        self._hints_shown = n + 1
        last = " (the last one: ex.solution() shows the kit's answer)" \
            if n == len(self.hints) - 1 else ""
        body = self.hints[n] if n else f"{self._your_run()} {self.hints[0]}"
        return Text(f"Hint {n + 1} of {len(self.hints)}{last}", body)

    def _your_run(self) -> str:
        """Say what the participant's own last check showed (the first hint starts with it)."""
        out = self._last
        if out is None:
            return ("You have not checked an answer yet: run ex.check(answer) first, and this "
                    "hint starts with what your run showed.")
        if out.correct:
            return f"Your last check passed {OK}."
        failed = next((c for c in out.checks if not c.ok), None)
        if failed is None:
            return f"Your last check: {out.error or out.nudge}."
        return (f"Your last check, {failed.name}: expected {failed.expected}; measured "
                f"{failed.measured}.")

    def solution(self) -> Text:
        """Show the kit's answer, as a participant would write it."""
        return Text(f"The kit's answer to {self.notebook} · {self.title}", self.answer, code=True)

    def __repr__(self) -> str:
        return f"exercise {self.id} ({self.notebook}): {self.title}"


def judge(ex: Exercise, answer: object) -> Outcome:
    """Check the answer in a sandbox of its own; every failure of the answer is one line."""
    solution = ex.answer if settings.solutions() else None
    base: dict[str, Any] = {"id": ex.id, "title": ex.title, "solution": solution}
    try:
        text = answer_text(answer)
        if not strip_comments(text).strip():
            return Outcome(**base, error="your answer is empty: write the SQL as a string, "
                                          "e.g. answer = \"\"\"select ...\"\"\"")
        if ex.screen:
            ex.screen(text)
        with sandbox(f"ex {ex.id}", owner=ex.owner) as sb:
            rules = Rules(sb, ex.may_change)
            try:
                checks, nudge = ex.scenario(text, sb)
            except psycopg.OperationalError as e:
                # The kit's own statement on a connection the answer ended (it may end the
                # check's sessions: they are its role's).
                raise AnswerFailed(f"a connection of the check was ended while it ran: "
                                   f"{one_line(e)} (did your answer end a session?)") from e
            except psycopg.Error as e:
                # The kit's own statement failed on what the answer left (a policy, a rule).
                raise AnswerFailed(f"the check's own statements failed after your answer: "
                                   f"{one_line(e)}") from e
            if changed := rules.changed():
                raise Refused(f"your answer changed the rules it is checked by ({changed}): "
                              "the fix must work with the schema, policies, grants and roles "
                              "as they are")
    except Unusable as e:
        return Outcome(**base, error=str(e), checked=False)
    except AnswerFailed as e:
        return Outcome(**base, error=str(e))
    except Refused as e:
        return Outcome(**base, checks=(check("plays by the rules", False,
                                             "schema, policies, grants, roles, other jobs "
                                             "unchanged", "changed"),), error=f"refused: {e}")
    return Outcome(**base, checks=tuple(checks), nudge=nudge)


def first_nudge(pairs: list[tuple[Check, str]]) -> tuple[list[Check], str]:
    """Return the checks and the nudge of the first check that failed ("" when all hold)."""
    checks = [c for c, _ in pairs]
    nudge = next((n for c, n in pairs if not c.ok), "")
    return checks, nudge


def over_runs(runs: Sequence[tuple[str, tuple[list[Check], str]]]) -> tuple[list[Check], str]:
    """Combine the checks of several runs, by name: a check holds when it held in every run.

    A failed check shows the first run where it failed (``measured ... (run 2 of 3: ...)``),
    and the nudge is that of the first check (in order) that failed, from that run.
    """
    label = {i: f"run {i + 1} of {len(runs)}: {what}" for i, (what, _) in enumerate(runs)}
    names: list[str] = []
    found: dict[str, tuple[int, Check, str]] = {}  # name -> (run, check, nudge) to show
    for i, (_, (checks, nudge)) in enumerate(runs):
        for c in checks:
            if c.name not in found:
                names.append(c.name)
                found[c.name] = (i, c, nudge if not c.ok else "")
            elif found[c.name][1].ok and not c.ok:
                found[c.name] = (i, c, nudge)
    combined: list[Check] = []
    first = ""
    for name in names:
        i, c, nudge = found[name]
        if c.ok:
            combined.append(c)
            continue
        combined.append(Check(c.name, False, c.expected, f"{c.measured} ({label[i]})"))
        first = first or f"{nudge} ({label[i]})"
    return combined, first


@contextmanager
def worker(sb: Sandbox, name: str, autocommit: bool = True,
           role: str = "worker") -> Iterator[psycopg.Connection]:
    """Log in as the check's role, under the exercises' timeouts; close it as a process ends.

    Never ``with conn:``: its exit commits what the answer left open. A worker that goes away
    closes its connection, and PostgreSQL rolls back whatever transaction was still open.
    """
    conn = sb.connect(role, f"exercise {name}", autocommit=autocommit, options=OPTIONS)
    try:
        yield conn
    finally:
        conn.close()


@contextmanager
def admin(sb: Sandbox, name: str) -> Iterator[psycopg.Connection]:
    """Connect as the judge: admin, in the scratch database, never evaluating an answer's policy."""
    with sb.connect("admin", f"exercise {name}", autocommit=True, options=ADMIN_OPTIONS) as conn:
        yield conn


# --- progress --------------------------------------------------------------------------------

def progress_file() -> Path:
    """Return where progress is kept: TENANTLAB_EXERCISES, else the lab's state directory."""
    if path := settings.exercises_file():
        return path
    from ..server import home

    return home() / "exercises.json"


def load_progress() -> dict[str, Any]:
    try:
        data = json.loads(progress_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record(exercise: str, correct: bool) -> None:
    """Count a try, and remember a correct answer (a later wrong one does not undo it)."""
    data = load_progress()
    old = data.get(exercise)
    entry: dict[str, Any] = old if isinstance(old, dict) else {}
    entry = {"tries": int(entry.get("tries", 0)) + 1,
             "correct": bool(entry.get("correct")) or correct}
    data[exercise] = entry
    path = progress_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError as e:  # a read-only state directory must not break the exercise
        log.warning("could not keep exercise progress in %s: %s", path, e)


# --- the queue's claims and finishes ---------------------------------------------------------

#: The single-transaction claim (naive): its `begin` keeps the count in the work's transaction.
NAIVE_CLAIM = """\
begin;
update jobs set attempts = attempts + 1
 where id = (select id from jobs
              where status = 'queued'
              order by id limit 1
              for update skip locked)
returning id, tenant_id, attempts as attempt;
"""

#: The leased claim: commits on its own, marks the job running, counts, sets the lease.
LEASED_CLAIM = """\
update jobs
   set status = 'running', attempts = attempts + 1,
       locked_until = clock_timestamp() + make_interval(secs => %(lease)s)
 where id = (select id from claimable
              order by claimable_at, id limit 1
              for update skip locked)
returning id, tenant_id, attempts as attempt;
"""


def fill_queue(admin: psycopg.Connection, batches: Iterable[tuple[int, str, int]],
               max_attempts: int = 3) -> Jobs:
    """Empty the queue, enqueue each (tenant, kind, count) batch of instant jobs, watch them."""
    admin.execute(q("reset_queue"))
    for tenant, kind, count in batches:
        admin.execute(q("enqueue_demo"), {"tenant": tenant, "kind": kind, "seconds": 0.0,
                                          "count": count, "max_attempts": max_attempts,
                                          "write": False})
    return Jobs(admin)


def claim_within_budget(conn: psycopg.Connection, text: str, params: dict[str, Any],
                        what: str) -> list[tuple[int, int]] | None:
    """Run a claim and return what it took; None when it took a job whose attempts are spent.

    The constraint attempts_within_budget refuses such a claim: the nudge names it.
    """
    try:
        return claimed(run_answer(conn, text, params, what), what)
    except AnswerFailed as e:
        if e.constraint != "attempts_within_budget":
            raise
        return None


def claimed(cur: psycopg.Cursor[Any], what: str) -> list[tuple[int, int]]:
    """Return (job id, attempt) per row the claim returned; a wrong shape is one line."""
    out = []
    for row in rows_of(cur):
        attempt = row.get("attempt", row.get("attempts"))
        if row.get("id") is None or attempt is None:
            raise Unusable(f"{what} returned columns {', '.join(row) or 'none'}: a claim "
                           "returns the job's id and its attempt (returning id, tenant_id, "
                           "attempts as attempt)")
        try:
            out.append((int(row["id"]), int(attempt)))
        except (TypeError, ValueError):
            raise Unusable(f"{what} returned id {row['id']!r} and attempt {attempt!r}: a claim "
                           "returns the job's id and its attempt, two numbers") from None
    return out


def finished_count(cur: psycopg.Cursor[Any], what: str) -> int:
    """Return how many jobs a finish says it finished: its row count, or a returned count.

    The worker commits or rolls back by it, as a real worker would; the judge never trusts it:
    it reads the job's state.
    """
    if cur.description is None:
        return max(cur.rowcount, 0)
    rows = rows_of(cur)
    if len(rows) == 1 and "finished" in rows[0]:
        try:
            return int(rows[0]["finished"] or 0)
        except (TypeError, ValueError):
            raise Unusable(f"{what} returned finished = {rows[0]['finished']!r}: a finish "
                           "says how many jobs it finished, a number (or its row count)") from None
    return len(rows)


def in_transaction(conn: psycopg.Connection) -> bool:
    return conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


def split_work(answer: str) -> tuple[str, str]:
    """Split a worker's script at its ``-- work`` line: (claim part, finish part)."""
    parts = re.split(r"^[ \t]*--[ \t]*work\b[^\n]*$", answer, maxsplit=1, flags=re.M | re.I)
    if len(parts) != 2:
        raise Unusable("your script needs a line starting with `-- work` between the claim "
                       "and the finish: that is where the kit runs the job")
    return parts[0], parts[1]
