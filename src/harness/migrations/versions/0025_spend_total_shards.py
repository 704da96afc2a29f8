"""Each running spend total spread over up to 16 rows, `spend_totals.shard`.

Every cost is added to its user's and its tenant's total in the cost's own transaction, by an upsert that
locks the total's row until that transaction commits. With one row per total, every Run of a tenant
queued on the tenant's row: at 5,000 Runs in flight on PostgreSQL the upsert waited 10.8 ms a call, each
waiting out the commits before it, on every service replica and worker using the database. A Run's costs
now go to one of 16 rows of each total (chosen from its run id, so a Run always takes the same rows), and a
total is the sum of its rows: two Runs of a tenant meet on a row one time in 16.

The table is copied: existing totals become shard 0, exactly as they were. Downgrading folds each total's
rows back into one. Workers of an older version must be stopped before the upgrade: on PostgreSQL and
SQLite their upsert names the old primary key and is refused (on MySQL/MariaDB it adds to row 0, which is
still counted). The table is small (a few rows per user).

Revision ID: 0025_spend_total_shards
Revises: 0024_knowledge_tsvector
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025_spend_total_shards"
down_revision = "0024_knowledge_tsvector"
branch_labels = None
depends_on = None

TABLE = "spend_totals"
NEXT = "spend_totals_next"


def _create(name: str, *, sharded: bool, pk_name: str) -> None:
    columns = [
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("usd", sa.Double, nullable=False),
        sa.Column("cost_count", sa.BigInteger, nullable=False),
    ]
    keys = ["tenant_id", "user_id"]
    if sharded:
        columns.append(sa.Column("shard", sa.SmallInteger, nullable=False, server_default="0"))
        keys.append("shard")
    op.create_table(name, *columns, sa.PrimaryKeyConstraint(*keys, name=pk_name))


def _replace_with(copy: str) -> None:
    op.execute(copy)
    op.drop_table(TABLE)
    op.rename_table(NEXT, TABLE)


def upgrade() -> None:
    _create(NEXT, sharded=True, pk_name="spend_totals_shard_pkey")
    _replace_with(f"INSERT INTO {NEXT} (tenant_id, user_id, usd, cost_count, shard) "
                  f"SELECT tenant_id, user_id, usd, cost_count, 0 FROM {TABLE}")


def downgrade() -> None:
    _create(NEXT, sharded=False, pk_name="spend_totals_total_pkey")
    _replace_with(f"INSERT INTO {NEXT} (tenant_id, user_id, usd, cost_count) "
                  f"SELECT tenant_id, user_id, SUM(usd), SUM(cost_count) FROM {TABLE} GROUP BY tenant_id, user_id")
