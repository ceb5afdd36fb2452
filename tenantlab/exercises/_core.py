"""Run a participant's answer safely, judge it with named checks, and show expected vs measured.

An answer is SQL text. It runs in a scratch database of its own (dropped afterwards, also when
the cell is interrupted), as the worker role (08's migration as the table owner, the only role
that may change a policy), under a statement and a lock timeout; parameters (``%(tenant)s``,
``%(id)s``, ...) are bound client-side as literals, so ``SET LOCAL app.tenant = %(tenant)s``
works as well as ``set_config``. Before anything runs, words that would change the rules instead
of the design (``grant``, ``role``, ``truncate``, a timeout, ...) are refused; afterwards the
catalog facts (policies, row security, grants, columns, roles) are compared with before, and
every claim or finish may change only the jobs it took.
"""

from __future__ import annotations

import html
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .. import db, settings
from ..finding import OK, Check, check
from ..queries import q

log = logging.getLogger("tenantlab")

NOT_YET = "not yet"
#: Every statement of an answer stops after this long (a loop, a lock wait, a pg_sleep).
STATEMENT_TIMEOUT_MS = 3000
LOCK_TIMEOUT_MS = 1000
OPTIONS = (f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={LOCK_TIMEOUT_MS} "
           "-c idle_in_transaction_session_timeout=20000")

#: Words no answer needs: each changes who may do what, or how long a statement may run.
FORBIDDEN = ("grant", "revoke", "role", "authorization", "bypassrls", "superuser", "row_security",
             "truncate", "copy", "delete", "statement_timeout", "lock_timeout",
             "idle_in_transaction_session_timeout", "session_replication_role", "pg_sleep",
             "pg_terminate_backend", "pg_cancel_backend", "dblink", "lo_import", "lo_export",
             "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "definer", "vacuum",
             "execute", "language")
#: Schema changes: only exercise 08's answer (a migration) may make some.
DDL = ("drop", "alter", "create", "comment", "reindex", "cluster", "lock")


class AnswerFailed(Exception):
    """The answer could not run (syntax, timeout, a missing parameter, an error): one line."""

    def __init__(self, line: str, constraint: str | None = None) -> None:
        super().__init__(line)
        self.constraint = constraint


class Refused(Exception):
    """The answer changes the rules the check runs by (a grant, a policy, the jobs by hand)."""


def strip_comments(text: str) -> str:
    """Return text without -- and /* */ comments (a comment may say 'role' freely)."""
    return re.sub(r"--[^\n]*|/\*.*?\*/", " ", text, flags=re.S)


def words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", strip_comments(text))}


def refuse_words(text: str, allowed: tuple[str, ...] = ()) -> None:
    """Raise Refused when the answer names something only a change of the rules needs."""
    found = sorted((words(text) & set(FORBIDDEN + DDL)) - set(allowed))
    if re.search(r"\bdo\s*(\$|')", strip_comments(text), re.I):
        found.insert(0, "do")
    if found:
        raise Refused(f"your answer uses {found[0].upper()}: the check runs your answer with "
                      "the schema, the policies and the grants as they are, so the fix must "
                      "work without changing them")


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def run_answer(conn: psycopg.Connection, text: str, params: dict[str, Any],
               what: str = "your answer") -> psycopg.Cursor[Any]:
    """Run the answer's statements on conn; return the cursor at the last result.

    Parameters are bound client-side (as literals): several statements may run at once.
    """
    cur: psycopg.Cursor[Any] = psycopg.ClientCursor(conn)
    # The server's timeout, and a client-side one in case an answer found a way to lift it.
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
        raise AnswerFailed(f"{what} was refused: {one_line(e)} (it runs as the worker role)") from e
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
    """The catalog facts before an answer ran; ``changed()`` names what differs afterwards."""

    def __init__(self, admin_dsn: str, may_change: tuple[str, ...] = ()) -> None:
        self.dsn = admin_dsn
        self.may_change = may_change
        self.before = self._facts()

    def _facts(self) -> set[str]:
        with db.connect(self.dsn, "exercise rules", autocommit=True) as conn:
            return {r[0] for r in conn.execute(q("exercise_rules"))
                    if not r[0].startswith(self.may_change)}

    def changed(self) -> str | None:
        after = self._facts()
        gone, new = sorted(self.before - after), sorted(after - self.before)
        if not gone and not new:
            return None
        return f"was: {gone[0]}" if gone else f"now: {new[0]}"


class Jobs:
    """Every job's state as admin: which jobs did a statement change?"""

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


@dataclass(frozen=True)
class Outcome:
    """One check of an answer: the named checks, and a nudge naming the symptom when not yet."""

    id: str
    title: str
    checks: tuple[Check, ...] = ()
    nudge: str = ""
    error: str = ""
    solution: str | None = None

    @property
    def correct(self) -> bool:
        return not self.error and bool(self.checks) and all(c.ok for c in self.checks)

    def __bool__(self) -> bool:
        return self.correct

    def headline(self) -> str:
        if self.correct:
            return f"{OK} {self.title}: your answer does it"
        return f"{NOT_YET}: {self.error or self.nudge}"

    def line(self) -> str:
        return self.headline()

    __str__ = line

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "correct": self.correct,
                "checks": [{"name": c.name, "expected": c.expected, "measured": c.measured,
                            "ok": c.ok} for c in self.checks],
                "nudge": "" if self.correct else (self.error or self.nudge)}

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


Scenario = Callable[[str, db.Scratch], tuple[list[Check], str]]


@dataclass
class Exercise:
    """One exercise: the starter, the scenario that judges an answer, hints, the kit's answer.

    ``scenario(answer, scratch)`` runs the finding's scenario with the answer and returns the
    checks and the nudge for the first one that failed. ``allowed`` lifts words off the
    forbidden list (08's migration), ``may_change`` the catalog facts it may change.
    """

    id: str
    notebook: str
    title: str
    task: str
    starter: str
    answer: str
    hints: tuple[str, ...]
    scenario: Scenario
    allowed: tuple[str, ...] = ()
    may_change: tuple[str, ...] = ()
    screen: Callable[[str], None] | None = None
    _hints_shown: int = field(default=0, repr=False)

    def check(self, answer: str) -> Outcome:
        """Run the finding's scenario with your answer and say what it measured."""
        outcome = judge(self, answer)
        record(self.id, outcome.correct)
        return outcome

    def hint(self) -> Text:
        """Show the next hint (one at a time)."""
        n = min(self._hints_shown, len(self.hints) - 1)
        self._hints_shown = n + 1
        last = " (the last one: ex.solution() shows the kit's answer)" \
            if n == len(self.hints) - 1 else ""
        return Text(f"Hint {n + 1} of {len(self.hints)}{last}", self.hints[n])

    def solution(self) -> Text:
        """Show the kit's answer, as a participant would write it."""
        return Text(f"The kit's answer to {self.notebook} · {self.title}", self.answer, code=True)

    def __repr__(self) -> str:
        return f"exercise {self.id} ({self.notebook}): {self.title}"


def judge(ex: Exercise, answer: str) -> Outcome:
    """Check the answer in a scratch database; every failure of the answer is one line."""
    solution = ex.answer if settings.solutions() else None
    base: dict[str, Any] = {"id": ex.id, "title": ex.title, "solution": solution}
    if not isinstance(answer, str) or not strip_comments(answer).strip():
        return Outcome(**base, error="your answer is empty: write the SQL as a string, "
                                      "e.g. answer = \"\"\"select ...\"\"\"")
    try:
        refuse_words(answer, ex.allowed)
        if ex.screen:
            ex.screen(answer)
        with db.scratch(f"ex {ex.id}") as s:
            rules = Rules(s.admin, ex.may_change)
            checks, nudge = ex.scenario(answer, s)
            if changed := rules.changed():
                raise Refused(f"your answer changed the rules it is checked by ({changed}): "
                              "the fix must work with the schema, policies and grants as they are")
    except AnswerFailed as e:
        return Outcome(**base, error=str(e))
    except Refused as e:
        return Outcome(**base, checks=(check("plays by the rules", False,
                                             "schema, policies, grants, other jobs unchanged",
                                             "changed"),), error=f"refused: {e}")
    return Outcome(**base, checks=tuple(checks), nudge=nudge)


def first_nudge(pairs: list[tuple[Check, str]]) -> tuple[list[Check], str]:
    """Return the checks and the nudge of the first check that failed ("" when all hold)."""
    checks = [c for c, _ in pairs]
    nudge = next((n for c, n in pairs if not c.ok), "")
    return checks, nudge


@contextmanager
def worker(s: db.Scratch, name: str, autocommit: bool = True) -> Iterator[psycopg.Connection]:
    """Connect as the worker role, under the exercises' timeouts; close it as a process ends.

    Never ``with conn:``: its exit commits what the answer left open. A worker that goes away
    closes its connection, and PostgreSQL rolls back whatever transaction was still open.
    """
    conn = s.connect("worker", f"exercise {name}", autocommit=autocommit, options=OPTIONS)
    try:
        yield conn
    finally:
        conn.close()


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


def refuse_if(answer: str, pattern: str, reason: str) -> None:
    """Raise Refused(reason) when the answer matches pattern (a status it must not write)."""
    if re.search(pattern, answer):
        raise Refused(reason)


def refuse_final_status(answer: str, why: str) -> None:
    """Refuse a claim that writes 'dead' or 'done' itself; why says whose job that is."""
    refuse_if(answer, r"'(dead|done)'",
              f"your claim writes a final status ('dead' or 'done') itself: {why}")


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


def behind_done(nxt: dict[str, Any], nudge: str) -> tuple[Check, str]:
    """Return the check that the job behind the bad one ended done, with its nudge."""
    return check("the job behind it", nxt["status"] == "done", "done", nxt["status"]), nudge


def claimed(cur: psycopg.Cursor[Any], what: str) -> list[tuple[int, int]]:
    """Return (job id, attempt) per row the claim returned; a wrong shape is one line."""
    rows = rows_of(cur)
    out = []
    for row in rows:
        attempt = row.get("attempt", row.get("attempts"))
        if row.get("id") is None or attempt is None:
            raise AnswerFailed(f"{what} returned columns {', '.join(row) or 'none'}: a claim "
                               "returns the job's id and its attempt (returning id, tenant_id, "
                               "attempts as attempt)")
        out.append((int(row["id"]), int(attempt)))
    return out


def finished_count(cur: psycopg.Cursor[Any]) -> int:
    """Return how many jobs a finish says it finished: its row count, or a returned count."""
    if cur.description is None:
        return max(cur.rowcount, 0)
    rows = rows_of(cur)
    if len(rows) == 1 and "finished" in rows[0]:
        return int(rows[0]["finished"] or 0)
    return len(rows)


def in_transaction(conn: psycopg.Connection) -> bool:
    return conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


def split_work(answer: str) -> tuple[str, str]:
    """Split a worker's script at its ``-- work`` line: (claim part, finish part)."""
    parts = re.split(r"^[ \t]*--[ \t]*work\b[^\n]*$", answer, maxsplit=1, flags=re.M | re.I)
    if len(parts) != 2:
        raise AnswerFailed("your script needs a line starting with `-- work` between the claim "
                           "and the finish: that is where the kit runs the job")
    return parts[0], parts[1]
