"""Running totals of recorded cost per user and per tenant (spend_totals), so the budget check (SPEC G1)
reads two rows instead of summing the tenant's whole cost history on every policy check.

One row per (tenant_id, user_id), and one per tenant with user_id '' for the tenant's own total (user
ids are never empty). The table is filled from the existing costs with the same SUM the budget check
ran until now, so an upgraded database's totals equal the sums exactly; from then on CostLedger adds
each cost to both totals in the cost's own transaction. `costs` stays the append-only source of truth
and `harness audit reconcile` compares the totals with its sums. Workers of an older version must be
stopped before the upgrade: a cost they record afterwards would reach `costs` but not the totals
(reconcile would name the difference).

Revision ID: 0008_spend_totals
Revises: 0007_linear_chain
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_spend_totals"
down_revision = "0007_linear_chain"
branch_labels = None
depends_on = None

TABLE = "spend_totals"
#: the totals of every user, then of every tenant (user_id ''), from the recorded costs
BACKFILL = (
    f"INSERT INTO {TABLE} (tenant_id, user_id, usd, cost_count) "
    "SELECT tenant_id, user_id, SUM(usd), COUNT(*) FROM costs GROUP BY tenant_id, user_id",
    f"INSERT INTO {TABLE} (tenant_id, user_id, usd, cost_count) "
    "SELECT tenant_id, '', SUM(usd), COUNT(*) FROM costs GROUP BY tenant_id",
)


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("tenant_id", sa.String(128), primary_key=True),
        sa.Column("user_id", sa.String(128), primary_key=True),
        sa.Column("usd", sa.Double, nullable=False),
        sa.Column("cost_count", sa.BigInteger, nullable=False),
    )
    for statement in BACKFILL:
        op.execute(statement)


def downgrade() -> None:
    op.drop_table(TABLE)
