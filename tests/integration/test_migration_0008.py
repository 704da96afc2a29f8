"""Migration 0008 adds the running spend totals on SQLite, PostgreSQL and MariaDB, on a database holding
recorded costs: the totals are filled with exactly the sums the budget check computed before, the costs
are kept row for row, schema.py matches the new table and the ledger adds to the totals from then on; it
reverts (the costs stay, the totals go) and re-applies, counting the costs recorded in between."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import create_engine, resolve_url
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.migration import head_revision, migrate
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.store import SqlStore
from harness.audit.reconcile import reconcile
from harness.clock import FakeClock

from .test_migration_0006 import _to, _version
from .test_spend_totals import SUMS, cost

BEFORE = "0007_linear_chain"
TABLE = "spend_totals"


def _record_directly(engine: sa.Engine, count: int, seed: int) -> None:
    """Costs as a harness before 0008 recorded them: rows of `costs` only, decimal amounts."""
    rng = random.Random(seed)
    rows = [{"run_id": f"run-{seed}-{i // 4}", "tenant_id": rng.choice(("acme", "ACME", "globex")),
             "user_id": rng.choice(("ana", "bo", "cy")), "source": "llm:fake:plan", "input_tokens": 10,
             "output_tokens": 5, "usd": round(rng.uniform(0, 0.03), 6), "at": 1_800_000_000.0 + i}
            for i in range(count)]
    with engine.begin() as conn:
        conn.execute(t.costs.insert(), rows)


#: the columns `costs` had at 0008 (later migrations add more)
_COLUMNS_0008 = ("id", "run_id", "tenant_id", "user_id", "source", "input_tokens", "output_tokens", "usd", "at")


def _costs(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(*(t.costs.c[c] for c in _COLUMNS_0008))
                                               .order_by(t.costs.c.id))]


def _sums(engine: sa.Engine) -> dict[tuple[str, str], tuple[int, float]]:
    """(tenant, user) -> (count, SUM(usd)) of the recorded costs, user '' for the whole tenant."""
    with engine.connect() as conn:
        return {(r[0], r[1]): (int(r[2]), float(r[3])) for r in conn.execute(SUMS)}


def _totals(engine: sa.Engine) -> dict[tuple[str, str], tuple[int, float]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT tenant_id, user_id, SUM(cost_count), SUM(usd) FROM {TABLE} "
                                    "GROUP BY tenant_id, user_id"))  # a total's rows (0025)
        return {(r[0], r[1]): (int(r[2]), float(r[3])) for r in rows}


def _assert_schema_after_0008(engine: sa.Engine) -> None:
    """spend_totals has the columns, types' nullability and primary key schema.py declares."""
    inspector = sa.inspect(engine)
    assert [(c["name"], c["nullable"]) for c in inspector.get_columns(TABLE)] == [
        (c.name, c.nullable) for c in t.spend_totals.columns]
    assert inspector.get_pk_constraint(TABLE)["constrained_columns"] == [c.name for c in t.spend_totals.primary_key]


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def test_upgrade_fills_the_totals_with_the_sums_of_the_recorded_costs(engine: sa.Engine) -> None:
    """Costs recorded at 0007 are kept row for row; each user's and tenant's total is exactly the SUM the
    budget check computed, with its count; reconcile agrees, and new costs go to the totals."""
    _to(engine, command.upgrade, BEFORE)
    _record_directly(engine, 250, seed=1)
    rows, expected = _costs(engine), _sums(engine)
    assert len(expected) == 3 * 4
    migrate(engine)
    assert _version(engine) == head_revision()
    assert _costs(engine) == rows
    assert _totals(engine) == expected
    _assert_schema_after_0008(engine)
    store = SqlStore(engine, FakeClock())
    assert reconcile(SqlReconcileReads(store)).ok
    ledger = CostLedger(store)
    ledger.record(cost("acme", "ana", "after", 0.5))
    ledger.record(cost("initech", "dee", "after-2", 0.25))
    totals, (count, usd) = _totals(engine), expected[("acme", "ana")]
    assert totals[("acme", "ana")][0] == count + 1
    assert totals[("acme", "ana")][1] == pytest.approx(usd + 0.5)
    assert totals[("initech", "")] == totals[("initech", "dee")] == (1, 0.25)
    assert reconcile(SqlReconcileReads(store)).ok


def test_downgrade_drops_the_totals_and_upgrade_counts_what_was_recorded_meanwhile(engine: sa.Engine) -> None:
    """Down to 0007 the totals table is gone and every cost is kept; costs recorded there (by a harness
    of that version) are in the totals once 0008 is applied again."""
    migrate(engine)
    store = SqlStore(engine, FakeClock())
    for i in range(20):
        CostLedger(store).record(cost("acme", ("ana", "bo")[i % 2], f"r{i // 3}", i / 64))
    rows = _costs(engine)
    _to(engine, command.downgrade, BEFORE)
    assert _version(engine) == BEFORE
    assert TABLE not in sa.inspect(engine).get_table_names()
    assert _costs(engine) == rows
    _record_directly(engine, 40, seed=2)
    expected = _sums(engine)
    migrate(engine)
    assert _version(engine) == head_revision()
    assert _totals(engine) == expected
    assert sum(count for (_, user), (count, _) in expected.items() if user == "") == 60
    _assert_schema_after_0008(engine)
    assert reconcile(SqlReconcileReads(store)).ok


def test_a_database_migrated_from_empty_has_no_totals_yet(engine: sa.Engine) -> None:
    """From empty, the table is there and empty, and the first cost creates its user's and tenant's rows."""
    migrate(engine)
    assert _totals(engine) == {}
    _assert_schema_after_0008(engine)
    CostLedger(SqlStore(engine, FakeClock())).record(cost("acme", "ana", "r1", 0.125))
    assert _totals(engine) == {("acme", ""): (1, 0.125), ("acme", "ana"): (1, 0.125)}
