"""Recorded cost per Run, user and tenant: what budgets are checked against (SPEC G1).

Every cost is a row of `costs`, append-only and the source of truth, and is also added to its user's and
its tenant's running totals (`spend_totals`) in the same transaction, by one upsert that each backend
applies under the totals' row locks: concurrent writers never lose an update. Each total is spread over
SHARDS rows, a Run's costs always going to the same one, so the Runs of a tenant do not all queue on one
row lock until each other's commits. So a budget check reads the Run's few cost rows and the rows of two
totals, however long the tenant's history.
"""

from __future__ import annotations

import datetime as dt
import json
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import connection_of, read_retried
from harness.adapters.sql.raw import RawStatements
from harness.adapters.sql.store import SqlStore
from harness.domain.costs import PLANNING, CostGroup, GroupBy, RunTotal, Spend
from harness.ports import Tx

if TYPE_CHECKING:
    from sqlalchemy.dialects import postgresql, sqlite

    from harness.domain.traces import CostTrace

b = sa.bindparam
costs, totals = t.costs, t.spend_totals
#: user_id of the tenant's own total (user ids are never empty)
TENANT_TOTAL = ""
#: rows each total is spread over: two Runs of one tenant add to the same row one time in SHARDS
SHARDS = 16
#: the most rows a total may be spread over: `spend_totals.shard` is a SMALLINT
MAX_SHARDS = 32_767

_INSERT = costs.insert()


def _run_spent(run_id: sa.ColumnElement[str] | str, *scope: sa.ColumnElement[bool]) -> sa.Select[float]:
    """The USD of the Run's costs within `scope` (its tenant, its user). Only the run_id index is searched
    (a handful of rows) and the scope is checked on those rows: a planner offered the tenant's index
    too may walk it (PostgreSQL did, with the table's statistics not yet gathered)."""
    usd = sa.case((sa.and_(*scope), costs.c.usd), else_=0.0)
    return sa.select(sa.func.coalesce(sa.func.sum(usd), 0.0)).where(costs.c.run_id == run_id)


def shard_of(run_id: str, shards: int = SHARDS) -> int:
    """The row of each total that a Run's costs add to: the same for every cost of the Run."""
    return zlib.crc32(run_id.encode()) % shards


def _total(tenant_id: sa.ColumnElement[str] | str, user_id: sa.ColumnElement[str] | str) -> sa.ColumnElement[float]:
    """One running total, the sum of its rows (0 for a scope that has recorded nothing)."""
    rows = sa.select(sa.func.sum(totals.c.usd)).where(totals.c.tenant_id == tenant_id, totals.c.user_id == user_id)
    return sa.func.coalesce(rows.scalar_subquery(), 0.0)


_BY_SCOPE = sa.select(
    _run_spent(b("p_run"), costs.c.tenant_id == b("p_tenant")).scalar_subquery().label("run_usd"),
    _total(b("p_tenant"), b("p_user")).label("user_usd"),
    _total(b("p_tenant"), TENANT_TOTAL).label("tenant_usd"),
)


def _add_to_totals(dialect: str) -> sa.Insert:
    """One statement adding a cost to its tenant's total, then to its user's (the rows of the Run's shard),
    creating either row on its first cost: an atomic upsert on each backend. The rows go in that order, so
    concurrent writers on the same shard take the two row locks in the same order and cannot deadlock on
    them. SQLAlchemy does not cache a multi-row INSERT's compilation (0.12 ms a call on SQLite), so the
    ledger runs it as a raw statement."""
    rows = [{"tenant_id": b("p_tenant"), "user_id": TENANT_TOTAL, "shard": b("p_shard"), "usd": b("p_usd"),
             "cost_count": 1},
            {"tenant_id": b("p_tenant"), "user_id": b("p_user"), "shard": b("p_shard"), "usd": b("p_usd"),
             "cost_count": 1}]
    # each dialect's module imported for its own backend only (the engine has loaded it already)
    if dialect in ("mysql", "mariadb"):
        from sqlalchemy.dialects import mysql

        on_duplicate = mysql.insert(totals).values(rows)
        return on_duplicate.on_duplicate_key_update(usd=totals.c.usd + on_duplicate.inserted.usd,
                                                    cost_count=totals.c.cost_count + on_duplicate.inserted.cost_count)
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql

        upsert: postgresql.Insert | sqlite.Insert = postgresql.insert(totals).values(rows)
    else:
        from sqlalchemy.dialects import sqlite

        upsert = sqlite.insert(totals).values(rows)
    added = upsert.excluded
    return upsert.on_conflict_do_update(index_elements=[totals.c.tenant_id, totals.c.user_id, totals.c.shard],
                                        set_={"usd": totals.c.usd + added.usd,
                                              "cost_count": totals.c.cost_count + added.cost_count})


def recount_totals(conn: sa.Connection, tenant_id: str) -> None:
    """Set the tenant's running totals to the sums of its recorded costs (one row each), in the caller's
    transaction: for costs copied in rather than recorded (replay seeds its scratch database so)."""
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

    def __init__(self, store: SqlStore, *, shards: int = SHARDS) -> None:
        if not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"a total is spread over 1 to {MAX_SHARDS} rows (the shard column is a small "
                             f"integer), not shards={shards}")
        self.store = store
        self.shards = shards
        self._raw = RawStatements(store.engine.dialect)
        self._add_to_totals = _add_to_totals(store.engine.dialect.name)

    def record(self, cost: CostTrace) -> None:
        """Record one cost and its trace record, in their own transaction; a cost that does not name its
        parent Run gets it from the Run (child Runs' costs count in their parent's total)."""
        with self.store.engine.begin() as conn:
            self.record_in(conn, cost)

    def record_in(self, tx: Tx, cost: CostTrace) -> None:
        """`record` inside the caller's transaction."""
        conn = connection_of(tx)
        if cost.parent_run_id is None:
            parent = conn.execute(sa.select(t.runs.c.parent_run_id).where(t.runs.c.run_id == cost.run_id)).scalar()
            if parent is not None:
                cost = cost.model_copy(update={"parent_run_id": parent})
        self.insert(conn, cost)
        self.store.enqueue(conn, [cost.to_record()], self.store.clock.now())

    def insert(self, conn: sa.Connection, cost: CostTrace) -> None:
        """Record one cost and add it to its user's and tenant's totals inside the caller's transaction
        (its CostTrace goes with that transaction). Nothing reads either write's result: on PostgreSQL both
        go with the transaction's next statement or its commit, in one round trip."""
        self._raw.later(conn, _INSERT, {
            "run_id": cost.run_id, "tenant_id": cost.tenant_id, "user_id": cost.user_id, "source": cost.source,
            "input_tokens": cost.input_tokens, "output_tokens": cost.output_tokens, "usd": cost.usd,
            "at": self.store.clock.now(), "api_calls": cost.api_calls, "sandbox_s": cost.sandbox_s,
            "skill_id": cost.skill_id, "model": cost.model, "parent_run_id": cost.parent_run_id,
            "unit_price": json.dumps(cost.unit_price, sort_keys=True) if cost.unit_price else None,
            "priced": cost.priced,
        })
        added = {"p_tenant": cost.tenant_id, "p_user": cost.user_id, "p_usd": cost.usd,
                 "p_shard": shard_of(cost.run_id, self.shards)}
        self._raw.later(conn, self._add_to_totals, added)

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

    # ------------------------------------------------------------------ totals and the cost view

    def run_total(self, run_id: str, *, until: float | None = None) -> RunTotal:
        """What the Run and its child Runs (at any depth) recorded, optionally only up to `until`: the total
        a RunTrace carries (SPEC A1). One statement: the Run's tree and each member's sums."""
        statement = _TREE_TOTALS[until is not None, self.store.engine.dialect.name == "postgresql"]
        params = {"p_run": run_id} if until is None else {"p_run": run_id, "p_until": until}
        rows = read_retried(self.store.reader, lambda conn: self._raw.mappings(conn, statement, params))
        sums = {r["run_id"]: RunTotal(int(r["input_tokens"]), int(r["output_tokens"]), int(r["api_calls"]),
                                      float(r["sandbox_s"]), float(r["usd"]), int(r["n"]), int(r["unpriced"]))
                for r in rows}
        own = sums.pop(run_id, RunTotal())
        return own.merged([total for total in sums.values() if total.costs], children=len(sums))

    def unpriced_calls(self, run_id: str) -> list[str]:
        """The models of the Run's calls recorded without a price."""
        with self.store.reader.connect() as conn:
            return list(_models(self._raw.fetchall(conn, _UNPRICED, {"p_run": run_id})))

    def spend(self, *, tenant_id: str, user_id: str, run_id: str) -> Spend:
        """What a budget check reads — the Run's, its user's and its tenant's spend, and the Run's models
        without a price — in one round trip on PostgreSQL (both reads in one pipeline)."""
        by_scope, unpriced = read_retried(self.store.reader, lambda conn: self._raw.fetch_each(
            conn, (_BY_SCOPE, {"p_tenant": tenant_id, "p_user": user_id, "p_run": run_id}),
            (_UNPRICED, {"p_run": run_id})))
        run_usd, user_usd, tenant_usd = by_scope[0]
        return Spend(float(run_usd), float(user_usd), float(tenant_usd), _models(unpriced))

    def by_group(self, group_by: GroupBy, *, tenant_id: str | None, since: float | None = None,
                 until: float | None = None, limit: int = 1000) -> list[CostGroup]:
        """Spend grouped by tenant, user, skill or UTC day, largest first (days: oldest first), within
        [since, until) and one tenant when given. Costs of no skill (planning calls) group as "(planning)"."""
        key: sa.ColumnElement[Any]
        if group_by == "tenant":
            key = costs.c.tenant_id
        elif group_by == "user":
            key = costs.c.user_id
        elif group_by == "skill":
            key = sa.func.coalesce(costs.c.skill_id, PLANNING)
        else:
            key = _day(self.store.engine.dialect.name)
        query = (sa.select(key.label("key"), *_MEASURES).group_by(key).limit(limit))
        query = query.order_by(key) if group_by == "day" else query.order_by(sa.func.sum(costs.c.usd).desc(), key)
        if tenant_id is not None:
            query = query.where(costs.c.tenant_id == tenant_id)
        if since is not None:
            query = query.where(costs.c.at >= since)
        if until is not None:
            query = query.where(costs.c.at < until)
        with self.store.reader.connect() as conn:
            rows = conn.execute(query).all()
        return [CostGroup(key=_day_label(r.key) if group_by == "day" else str(r.key), usd=float(r.usd),
                          input_tokens=int(r.input_tokens), output_tokens=int(r.output_tokens),
                          api_calls=int(r.api_calls), sandbox_s=float(r.sandbox_s), costs=int(r.n),
                          runs=int(r.runs), unpriced=int(r.unpriced)) for r in rows]


    def by_tenant_and_skill(self) -> list[tuple[str, str, CostGroup]]:
        """(tenant, skill, sums) of every recorded cost: what the Prometheus cost counters expose."""
        skill = sa.func.coalesce(costs.c.skill_id, PLANNING)
        query = sa.select(costs.c.tenant_id, skill.label("skill"), *_MEASURES).group_by(costs.c.tenant_id, skill)
        with self.store.reader.connect() as conn:
            rows = conn.execute(query).all()
        return [(str(r.tenant_id), str(r.skill), CostGroup(
            key=str(r.skill), usd=float(r.usd), input_tokens=int(r.input_tokens), output_tokens=int(r.output_tokens),
            api_calls=int(r.api_calls), sandbox_s=float(r.sandbox_s), costs=int(r.n), runs=int(r.runs),
            unpriced=int(r.unpriced))) for r in rows]


_DAY_S = 86_400
_MEASURES = (
    sa.func.coalesce(sa.func.sum(costs.c.usd), 0.0).label("usd"),
    sa.func.coalesce(sa.func.sum(costs.c.input_tokens), 0).label("input_tokens"),
    sa.func.coalesce(sa.func.sum(costs.c.output_tokens), 0).label("output_tokens"),
    sa.func.coalesce(sa.func.sum(costs.c.api_calls), 0).label("api_calls"),
    sa.func.coalesce(sa.func.sum(costs.c.sandbox_s), 0.0).label("sandbox_s"),
    sa.func.count().label("n"),
    sa.func.count(sa.distinct(costs.c.run_id)).label("runs"),
    sa.func.coalesce(sa.func.sum(sa.case((costs.c.priced.is_(False), 1), else_=0)), 0).label("unpriced"),
)


def _day(dialect: str) -> sa.ColumnElement[Any]:
    """The UTC day number (days since the epoch) of a cost: FLOOR where the database has it; SQLite, whose
    math functions are optional, truncates (the same for times after 1970)."""
    if dialect == "sqlite":
        return sa.cast(costs.c.at / _DAY_S, sa.Integer)
    return sa.cast(sa.func.floor(costs.c.at / _DAY_S), sa.BigInteger)


def _day_label(day: Any) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=int(day))).isoformat()


#: child Runs nest at most this deep (AgentInvoke allows 4): a cycle in bad data cannot loop forever
_MAX_DEPTH = 16


def descendants(conn: sa.Connection, run_ids: Sequence[str]) -> list[str]:
    """The Runs and all their child Runs, at any depth (through runs.parent_run_id, indexed)."""
    found, frontier = list(run_ids), list(run_ids)
    seen = set(found)
    for _ in range(_MAX_DEPTH):
        if not frontier:
            break
        children = [r for r in conn.execute(sa.select(t.runs.c.run_id).where(
            t.runs.c.parent_run_id.in_(frontier))).scalars() if r not in seen]
        seen.update(children)
        found.extend(children)
        frontier = children
    return found


def _tree_totals(*, until: bool, lateral: bool = False) -> sa.Select[Any]:
    """Each Run of a Run's tree (the Run, its child Runs at any depth, each once) with its own sums, Runs
    with no cost included (n = 0), optionally only costs up to :p_until: one statement, a recursive CTE
    down runs.parent_run_id (indexed), as deep as _MAX_DEPTH (a cycle in bad data cannot loop forever).

    `lateral` (PostgreSQL): each member's sums in a subquery of its own, on ix_costs_run. Joined to the
    members instead, the planner, which guesses hundreds of members for any recursive CTE, hashed the
    whole costs table at every call: a RunTrace's total read every cost ever recorded (3 ms with 6,000
    costs, and growing)."""
    depth = sa.literal_column("0", sa.Integer)  # constants in the SQL: an argument's type would be the driver's
    top = sa.select(t.runs.c.run_id, depth.label("depth")).where(
        t.runs.c.run_id == b("p_run")).cte("tree", recursive=True)
    child = t.runs.alias("child")
    tree = top.union_all(sa.select(child.c.run_id, top.c.depth + sa.literal_column("1", sa.Integer)).where(
        child.c.parent_run_id == top.c.run_id, top.c.depth < sa.literal_column(str(_MAX_DEPTH), sa.Integer)))
    members = sa.select(tree.c.run_id).distinct().subquery("members")
    joined = costs.c.run_id == members.c.run_id
    if until:
        joined = sa.and_(joined, costs.c.at <= b("p_until"))
    measures = (*_MEASURES[:5], sa.func.count(costs.c.run_id).label("n"), _MEASURES[7])
    if lateral:  # an aggregate without GROUP BY is one row, zeros for a member without costs
        sums = sa.select(*measures).where(joined).lateral("sums")
        return sa.select(members.c.run_id, *sums.c).select_from(members.join(sums, sa.true()))
    return sa.select(members.c.run_id, *measures).select_from(
        members.outerjoin(costs, joined)).group_by(members.c.run_id)


#: (until?, PostgreSQL?) -> the statement
_TREE_TOTALS = {(until, lateral): _tree_totals(until=until, lateral=lateral)
                for until in (False, True) for lateral in (False, True)}
_UNPRICED = sa.select(costs.c.model).where(costs.c.run_id == b("p_run"), costs.c.priced.is_(False))


def _models(rows: Sequence[Any]) -> tuple[str, ...]:
    """The distinct models of `_UNPRICED`'s rows, sorted."""
    return tuple(sorted({str(row[0]) for row in rows}))
