"""Migration 0025 spreads each running spend total over rows (`spend_totals.shard`) on SQLite, PostgreSQL
and MariaDB: the totals of a database holding recorded costs are kept exactly (as shard 0), schema.py
matches the new table, the ledger then adds each Run's costs to the row its id picks and every total still
equals the sum of its costs; it reverts, folding each total's rows back into one, and re-applies."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.ledger import CostLedger, shard_of
from harness.adapters.sql.migration import head_revision, migrate
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.store import SqlStore
from harness.audit.reconcile import reconcile
from harness.clock import FakeClock

from .test_migration_0006 import _to, _version
from .test_migration_0008 import BEFORE as BEFORE_0008
from .test_migration_0008 import _record_directly, _sums
from .test_spend_totals import cost

BEFORE = "0024_knowledge_tsvector"
AFTER = "0025_spend_total_shards"
TABLE = "spend_totals"
#: the totals as 0008 fills them: each user's and each tenant's sums, one row each
FILL = (
    f"INSERT INTO {TABLE} (tenant_id, user_id, usd, cost_count) "
    "SELECT tenant_id, user_id, SUM(usd), COUNT(*) FROM costs GROUP BY tenant_id, user_id",
    f"INSERT INTO {TABLE} (tenant_id, user_id, usd, cost_count) "
    "SELECT tenant_id, '', SUM(usd), COUNT(*) FROM costs GROUP BY tenant_id",
)


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def _rows(engine: sa.Engine) -> list[tuple[str, str, int, float]]:
    """Every row of the table, as (tenant, user, count, usd), sorted."""
    with engine.connect() as conn:
        return sorted((r[0], r[1], int(r[2]), float(r[3])) for r in conn.execute(
            sa.text(f"SELECT tenant_id, user_id, cost_count, usd FROM {TABLE}")))


def _totals(engine: sa.Engine) -> dict[tuple[str, str], tuple[int, float]]:
    """(tenant, user) -> (count, usd) summed over each total's rows."""
    with engine.connect() as conn:
        return {(r[0], r[1]): (int(r[2]), float(r[3])) for r in conn.execute(sa.text(
            f"SELECT tenant_id, user_id, SUM(cost_count), SUM(usd) FROM {TABLE} GROUP BY tenant_id, user_id"))}


def _assert_same(totals: dict[tuple[str, str], tuple[int, float]],
                 sums: dict[tuple[str, str], tuple[int, float]]) -> None:
    """Each total counts its costs exactly and sums them to float rounding (rows added in another order)."""
    assert totals.keys() == sums.keys()
    for key, (count, usd) in sums.items():
        assert totals[key][0] == count and totals[key][1] == pytest.approx(usd, rel=1e-12), key


def _primary_key(engine: sa.Engine) -> list[str]:
    return list(sa.inspect(engine).get_pk_constraint(TABLE)["constrained_columns"])


def test_the_totals_are_kept_as_one_row_each_then_spread_and_folded_back(engine: sa.Engine) -> None:
    _to(engine, command.upgrade, BEFORE_0008)
    _record_directly(engine, 120, seed=3)  # costs as recorded before 0008
    _to(engine, command.upgrade, BEFORE)
    with engine.begin() as conn:  # the totals a harness before 0025 kept: one row each, exact sums
        conn.execute(sa.text(f"DELETE FROM {TABLE}"))
        for statement in FILL:
            conn.execute(sa.text(statement))
    before = _rows(engine)
    assert _primary_key(engine) == ["tenant_id", "user_id"] and len(before) == 3 * 3 + 3

    migrate(engine)
    head = head_revision()
    assert head is not None
    assert _version(engine) == head and head >= AFTER
    assert _primary_key(engine) == ["tenant_id", "user_id", "shard"] == [c.name for c in t.spend_totals.primary_key]
    assert [(c["name"], c["nullable"]) for c in sa.inspect(engine).get_columns(TABLE)] == [
        (c.name, c.nullable) for c in t.spend_totals.columns]
    assert _rows(engine) == before
    with engine.connect() as conn:
        assert set(conn.execute(sa.text(f"SELECT shard FROM {TABLE}")).scalars()) == {0}
    store = SqlStore(engine, FakeClock())
    assert reconcile(SqlReconcileReads(store)).ok

    runs = [f"after-{i}" for i in range(12)]
    assert len({shard_of(run) for run in runs}) > 1
    ledger = CostLedger(store)
    for i, run in enumerate(runs):
        ledger.record(cost("acme", ("ana", "bo")[i % 2], run, (i + 1) / 256))
    assert len(_rows(engine)) > len(before)  # the new costs went to rows of their own
    _assert_same(_totals(engine), _sums(engine))
    assert ledger.spent(tenant_id="acme") == pytest.approx(_sums(engine)[("acme", "")][1], rel=1e-12)
    assert reconcile(SqlReconcileReads(store)).ok
    spread = _totals(engine)

    _to(engine, command.downgrade, BEFORE)
    assert _version(engine) == BEFORE
    assert _primary_key(engine) == ["tenant_id", "user_id"]
    _assert_same({(tenant, user): (count, usd) for tenant, user, count, usd in _rows(engine)}, spread)
    assert len(_rows(engine)) == len(spread)  # one row a total again

    migrate(engine)
    _assert_same(_totals(engine), spread)
    _assert_same(spread, _sums(engine))
    assert reconcile(SqlReconcileReads(store)).ok
