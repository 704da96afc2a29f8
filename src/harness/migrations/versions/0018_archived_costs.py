"""What pruned Runs spent: `archived_costs`, per segment, tenant and user, so reconcile still balances the
spend totals after a prune.

A prune deletes a Run's costs rows, but the running totals (`spend_totals`, 0008) keep counting them, as
a budget must. From now on the prune writes, in its own transaction, what the deleted costs added per
tenant and user; reconcile adds it to the live costs' sums. A database that pruned Runs before this
migration gets one row per tenant and user under the segment id `before-0018`: the difference between
its totals and its live costs at upgrade time, taken as it stands (the costs it stands for are in the
segments of that time, not in the database).

Revision ID: 0018_archived_costs
Revises: 0017_start_by
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_archived_costs"
down_revision = "0017_start_by"
branch_labels = None
depends_on = None

BEFORE = "before-0018"


def upgrade() -> None:
    op.create_table("archived_costs",
                    sa.Column("segment_id", sa.String(64), primary_key=True),
                    sa.Column("tenant_id", sa.String(128), primary_key=True),
                    sa.Column("user_id", sa.String(128), primary_key=True),
                    sa.Column("usd", sa.Double, nullable=False),
                    sa.Column("cost_count", sa.BigInteger, nullable=False))
    conn = op.get_bind()
    if not conn.execute(sa.text("SELECT 1 FROM archived_runs")).first():
        return
    # user rows only ('' is the tenant's own total, which reconcile sums from the users' rows)
    conn.execute(sa.text(
        "INSERT INTO archived_costs (segment_id, tenant_id, user_id, usd, cost_count) "
        "SELECT :before, s.tenant_id, s.user_id, s.usd - COALESCE(c.usd, 0), s.cost_count - COALESCE(c.n, 0) "
        "FROM spend_totals s LEFT JOIN (SELECT tenant_id, user_id, SUM(usd) AS usd, COUNT(*) AS n FROM costs "
        "GROUP BY tenant_id, user_id) c ON c.tenant_id = s.tenant_id AND c.user_id = s.user_id "
        "WHERE s.user_id <> '' AND s.cost_count > COALESCE(c.n, 0)"), {"before": BEFORE})


def downgrade() -> None:
    op.drop_table("archived_costs")
