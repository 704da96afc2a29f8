"""Migration 0012 adds the webhook outbox and a cost's full scope on SQLite, PostgreSQL and MariaDB, on a
database holding recorded costs: the costs are kept row for row and read as what they were (no API
calls, no sandbox seconds, priced, no skill), schema.py matches the new table and columns, and the ledger
and outbox work from then on; it reverts to 0008 (costs kept, outbox gone) and re-applies."""

from __future__ import annotations

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
from harness.adapters.sql.webhooks import WebhookOutbox
from harness.audit.reconcile import reconcile
from harness.clock import FakeClock
from harness.domain.webhooks import OutgoingEvent

from .test_migration_0006 import _to, _version
from .test_spend_totals import cost

BEFORE = "0011_idempotency_scope"
NEW_COST_COLUMNS = ["api_calls", "sandbox_s", "skill_id", "model", "parent_run_id", "unit_price", "priced"]


@pytest.fixture
def engine(empty_backend_url: str) -> Iterator[sa.Engine]:
    """An engine on an empty database of the backend under test."""
    e = create_engine(resolve_url(empty_backend_url))
    yield e
    e.dispose()


def _old_costs(engine: sa.Engine, n: int) -> None:
    columns = ["run_id", "tenant_id", "user_id", "source", "input_tokens", "output_tokens", "usd", "at"]
    with engine.begin() as conn:
        for i in range(n):
            conn.execute(sa.text(f"INSERT INTO costs ({', '.join(columns)}) VALUES "
                                 f"({', '.join(':' + c for c in columns)})"),
                         {"run_id": f"r{i}", "tenant_id": "acme", "user_id": "ana", "source": "llm:fake:plan",
                          "input_tokens": 10, "output_tokens": 5, "usd": 0.01 * i, "at": 1_800_000_000.0 + i})
        conn.execute(sa.text("INSERT INTO spend_totals (tenant_id, user_id, usd, cost_count) VALUES "
                             "('acme', '', :u, :n), ('acme', 'ana', :u, :n)"),
                     {"u": sum(0.01 * i for i in range(n)), "n": n})


def _costs(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(
            "SELECT id, run_id, tenant_id, user_id, source, input_tokens, output_tokens, usd, at FROM costs "
            "ORDER BY id"))]


def _assert_schema(engine: sa.Engine) -> None:
    inspector = sa.inspect(engine)
    table = "webhook_deliveries"
    assert [(c["name"], c["nullable"]) for c in inspector.get_columns(table)] == [
        (c.name, c.nullable) for c in t.webhook_deliveries.columns]
    costs = {c["name"]: c["nullable"] for c in inspector.get_columns("costs")}
    assert {name: costs[name] for name in NEW_COST_COLUMNS} == {
        name: t.costs.c[name].nullable for name in NEW_COST_COLUMNS}
    assert "ix_runs_parent" in {i["name"] for i in inspector.get_indexes("runs")}


def test_upgrade_keeps_recorded_costs_and_adds_the_outbox(engine: sa.Engine) -> None:
    """Costs recorded at 0008 stay row for row and read as priced, call-less, skill-less costs; new costs
    carry their full scope; the outbox queues; reconcile agrees."""
    _to(engine, command.upgrade, BEFORE)
    _old_costs(engine, 6)
    rows = _costs(engine)
    migrate(engine)
    assert _version(engine) == head_revision()
    assert _costs(engine) == rows
    _assert_schema(engine)
    with engine.connect() as conn:
        filled = conn.execute(sa.select(t.costs.c.api_calls, t.costs.c.sandbox_s, t.costs.c.priced,
                                        t.costs.c.skill_id)).all()
    assert {tuple(r) for r in filled} == {(0, 0.0, True, None)}
    store = SqlStore(engine, FakeClock())
    CostLedger(store).record(cost("acme", "ana", "after", 0.5))
    assert reconcile(SqlReconcileReads(store)).ok
    with engine.begin() as conn:
        WebhookOutbox(store).enqueue(conn, [OutgoingEvent("e1", "run.finished", None, "acme", "caller:acme",
                                                          "http://127.0.0.1:9/x", {"n": 1})])
    assert WebhookOutbox(store).counts() == {"pending": 1, "delivered": 0, "dead": 0}


def test_downgrade_keeps_the_costs_and_drops_the_outbox(engine: sa.Engine) -> None:
    """Down to 0008 the outbox and the new cost columns are gone and every cost is kept; up again, the
    costs read as before."""
    migrate(engine)
    store = SqlStore(engine, FakeClock())
    for i in range(4):
        CostLedger(store).record(cost("acme", "ana", f"r{i}", i / 8))
    rows = _costs(engine)
    _to(engine, command.downgrade, BEFORE)
    assert _version(engine) == BEFORE
    assert "webhook_deliveries" not in sa.inspect(engine).get_table_names()
    assert not set(NEW_COST_COLUMNS) & {c["name"] for c in sa.inspect(engine).get_columns("costs")}
    assert _costs(engine) == rows
    migrate(engine)
    assert _costs(engine) == rows
    _assert_schema(engine)
    assert reconcile(SqlReconcileReads(store)).ok
