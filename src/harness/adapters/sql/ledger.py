"""Recorded cost per Run, user and tenant: what budgets are checked against (SPEC G1).

Every cost is a row of `costs`, append-only and the source of truth, and is also added to its user's and
its tenant's running totals (`spend_totals`) in the same transaction, by one upsert that each backend
applies under the totals' row locks: concurrent writers queue on a total and never lose an update. So a
budget check reads the Run's few cost rows and two totals, however long the tenant's history.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from harness.adapters.sql import schema as t
from harness.adapters.sql.raw import RawStatements
from harness.adapters.sql.store import SqlStore
from harness.pipeline.trace_recorder import CostTrace

b = sa.bindparam
costs, totals = t.costs, t.spend_totals
#: user_id of the tenant's own total (user ids are never empty)
TENANT_TOTAL = ""

_INSERT = costs.insert()


def _run_spent(run_id: sa.ColumnElement[str] | str, *scope: sa.ColumnElement[bool]) -> sa.Select[float]:
    """The USD of the Run's costs within `scope` (its tenant, its user). Only the run_id index is searched
    (a handful of rows) and the scope is checked on those rows: a planner offered the tenant's index
    too may walk it (PostgreSQL did, with the table's statistics not yet gathered)."""
    usd = sa.case((sa.and_(*scope), costs.c.usd), else_=0.0)
    return sa.select(sa.func.coalesce(sa.func.sum(usd), 0.0)).where(costs.c.run_id == run_id)


def _total(tenant_id: sa.ColumnElement[str] | str, user_id: sa.ColumnElement[str] | str) -> sa.ColumnElement[float]:
    """One running total (0 for a scope that has recorded nothing)."""
    row = sa.select(totals.c.usd).where(totals.c.tenant_id == tenant_id, totals.c.user_id == user_id)
    return sa.func.coalesce(row.scalar_subquery(), 0.0)


_BY_SCOPE = sa.select(
    _run_spent(b("p_run"), costs.c.tenant_id == b("p_tenant")).scalar_subquery().label("run_usd"),
    _total(b("p_tenant"), b("p_user")).label("user_usd"),
    _total(b("p_tenant"), TENANT_TOTAL).label("tenant_usd"),
)


def _add_to_totals(dialect: str) -> sa.Insert:
    """One statement adding a cost to its tenant's total, then to its user's, creating either on its
    first cost: an atomic upsert on each backend. The rows go in that order, so concurrent writers take
    the two row locks in the same order and cannot deadlock on them. SQLAlchemy does not cache a
    multi-row INSERT's compilation (0.12 ms a call on SQLite), so the ledger runs it as a raw statement."""
    rows = [{"tenant_id": b("p_tenant"), "user_id": TENANT_TOTAL, "usd": b("p_usd"), "cost_count": 1},
            {"tenant_id": b("p_tenant"), "user_id": b("p_user"), "usd": b("p_usd"), "cost_count": 1}]
    if dialect in ("mysql", "mariadb"):
        on_duplicate = mysql.insert(totals).values(rows)
        return on_duplicate.on_duplicate_key_update(usd=totals.c.usd + on_duplicate.inserted.usd,
                                                    cost_count=totals.c.cost_count + on_duplicate.inserted.cost_count)
    upsert = (postgresql.insert(totals) if dialect == "postgresql" else sqlite.insert(totals)).values(rows)
    added = upsert.excluded
    return upsert.on_conflict_do_update(index_elements=[totals.c.tenant_id, totals.c.user_id],
                                        set_={"usd": totals.c.usd + added.usd,
                                              "cost_count": totals.c.cost_count + added.cost_count})


def recount_totals(conn: sa.Connection, tenant_id: str) -> None:
    """Set the tenant's running totals to the sums of its recorded costs, in the caller's transaction:
    for costs copied in rather than recorded (replay seeds its scratch database so)."""
    conn.execute(totals.delete().where(totals.c.tenant_id == tenant_id))
    columns = ["tenant_id", "user_id", "usd", "cost_count"]
    sums = (sa.func.sum(costs.c.usd), sa.func.count())
    by_user = sa.select(costs.c.tenant_id, costs.c.user_id, *sums).group_by(costs.c.tenant_id, costs.c.user_id)
    by_tenant = sa.select(costs.c.tenant_id, sa.literal(TENANT_TOTAL), *sums).group_by(costs.c.tenant_id)
    for query in (by_user, by_tenant):
        conn.execute(totals.insert().from_select(columns, query.where(costs.c.tenant_id == tenant_id)))


class CostLedger:
    """Appends costs (with their CostTrace, in one transaction), keeps their running totals and reads
    them by scope."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self._raw = RawStatements(store.engine.dialect)
        self._add_to_totals = _add_to_totals(store.engine.dialect.name)

    def record(self, cost: CostTrace) -> None:
        """Record one cost and its trace record, in their own transaction."""
        with self.store.engine.begin() as conn:
            self.insert(conn, cost)
            self.store.enqueue(conn, [cost.to_record()], self.store.clock.now())

    def insert(self, conn: sa.Connection, cost: CostTrace) -> None:
        """Record one cost and add it to its user's and tenant's totals inside the caller's transaction
        (its CostTrace goes with that transaction)."""
        conn.execute(_INSERT, {
            "run_id": cost.run_id, "tenant_id": cost.tenant_id, "user_id": cost.user_id, "source": cost.source,
            "input_tokens": cost.input_tokens, "output_tokens": cost.output_tokens, "usd": cost.usd,
            "at": self.store.clock.now(),
        })
        added = {"p_tenant": cost.tenant_id, "p_user": cost.user_id, "p_usd": cost.usd}
        self._raw.execute(conn, self._add_to_totals, added).close()

    def spent_by_scope(self, *, tenant_id: str, user_id: str, run_id: str) -> tuple[float, float, float]:
        """(run, user, tenant) spend in one query: the budget check's three numbers. A read, on the
        read-only connection (on SQLite it does not queue for the write lock)."""
        with self.store.reader.connect() as conn:
            run_usd, user_usd, tenant_usd = self._raw.fetchone(
                conn, _BY_SCOPE, {"p_tenant": tenant_id, "p_user": user_id, "p_run": run_id})
        return float(run_usd), float(user_usd), float(tenant_usd)

    def spent(self, *, tenant_id: str, user_id: str | None = None, run_id: str | None = None) -> float:
        """USD recorded for a tenant, optionally narrowed to one user or one Run."""
        query: sa.Select[float]
        if run_id is None:
            query = sa.select(_total(tenant_id, TENANT_TOTAL if user_id is None else user_id))
        else:
            scope = [costs.c.tenant_id == tenant_id, *([] if user_id is None else [costs.c.user_id == user_id])]
            query = _run_spent(run_id, *scope)
        with self.store.reader.connect() as conn:
            return float(conn.execute(query).scalar_one())
