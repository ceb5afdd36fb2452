"""Look at the lab's schema and check the facts every lesson relies on (notebook 00, tests)."""

from __future__ import annotations

import pandas as pd

from . import queries
from .db import Scratch, frame, scratch
from .tenant import count_invoices, set_tenant


def tables(s: Scratch) -> pd.DataFrame:
    """Return every column of the lab's tables, with its type."""
    with s.connect("admin", "schema") as conn:
        return frame(conn, queries.q("describe_columns"))


def constraints(s: Scratch) -> pd.DataFrame:
    """Return the named CHECK constraints: the invariants the schema guards."""
    with s.connect("admin", "schema") as conn:
        return frame(conn, queries.q("describe_constraints"))


def roles(s: Scratch) -> pd.DataFrame:
    with s.connect("admin", "schema") as conn:
        return frame(conn, queries.q("role_facts"))


def policy(s: Scratch) -> dict:
    """Return how row-level security stands on invoices: enabled, forced, the policy, the owner."""
    with s.connect("admin", "schema") as conn:
        row = frame(conn, queries.q("invoice_policy"))
    return row.iloc[0].to_dict()


def count_as(s: Scratch, tenant: int | None) -> int:
    """Count invoices as the worker role, with the tenant set locally (None: nothing set)."""
    with s.connect("worker", "rls-demo") as conn:
        if tenant is not None:
            set_tenant(conn, tenant, local=True)
        return count_invoices(conn)


def rls_demo(s: Scratch, tenants: tuple[int | None, ...] = (1, 2, None)) -> pd.DataFrame:
    """Count invoices as the worker role for each tenant context (None: no tenant set)."""
    rows = [{"tenant context": "none" if t is None else f"tenant {t}",
             "invoices visible": count_as(s, t)} for t in tenants]
    return pd.DataFrame(rows)


def facts() -> dict:
    """Check the lab in a scratch database; return the facts notebook 00 shows."""
    with scratch("start") as s:
        with s.connect("worker", "whoami") as conn:
            who = conn.execute(queries.q("whoami")).fetchone() or (None, None)
        return {
            "tables": tables(s),
            "constraints": constraints(s),
            "roles": roles(s),
            "policy": policy(s),
            "rls": rls_demo(s),
            "worker": {"user": who[0], "owns_invoices": who[1]},
        }


def tenant_explorer():
    """Return a slider that counts, live, the invoices the worker sees as the chosen tenant."""
    import ipywidgets as w

    slider = w.IntSlider(value=1, min=0, max=100, description="tenant",
                         continuous_update=False)
    out = w.HTML()

    def redraw(_change=None) -> None:
        t = slider.value or None
        with scratch("explorer") as s:
            n = count_as(s, t)
        who = "no tenant set" if t is None else f"tenant {t}"
        out.value = f"<b>{n:,}</b> invoices visible to tenantlab_worker with {who}"

    slider.observe(redraw, names="value")
    redraw()
    return w.VBox([slider, out])


def check(facts: dict) -> list[str]:
    """Return one verdict line per fact the lessons rely on."""
    rls = dict(zip(facts["rls"]["tenant context"], facts["rls"]["invoices visible"], strict=True))
    roles = facts["roles"].set_index("role")
    worker = roles.loc["tenantlab_worker"]
    lines = [
        (rls.get("tenant 1") == 20000, "tenant 1 sees 20,000 invoices", f"{rls.get('tenant 1'):,}"),
        (rls.get("tenant 2") == 10000, "tenant 2 sees 10,000", f"{rls.get('tenant 2'):,}"),
        (rls.get("none") == 0, "no tenant sees 0", f"{rls.get('none'):,}"),
        (not worker.superuser and not worker.bypassrls and not facts["worker"]["owns_invoices"],
         "the worker is not superuser, not owner, no BYPASSRLS",
         f"superuser={worker.superuser}, bypassrls={worker.bypassrls}, "
         f"owner={facts['worker']['owns_invoices']}"),
        (bool(facts["policy"]["forced"]), "RLS forced on invoices", f"forced={facts['policy']['forced']}"),
    ]
    return [("✓ " if ok else "✗ ") + f"{what}: {seen}" for ok, what, seen in lines]
