"""The webhook outbox (SPEC P4 / N1) and the full scope of a cost (seed 004 §3.6 CostTrace, SPEC G1, A1).

`webhook_deliveries` holds one row per event and endpoint, written in the transaction of the state change
(or approval request) it tells about, so no event exists without its change and no change without its
event. Delivery processes claim due rows under a lease (`lease_owner`, `lease_expires_at`; SELECT … FOR
UPDATE SKIP LOCKED on PostgreSQL and MariaDB, the write lock on SQLite), count the attempt, send it
signed, and mark it delivered, or schedule the next attempt with exponential backoff, or dead after the
last. `event_id` is stable across attempts (receivers deduplicate on it); `delivery_id` is the
webhook-id header, one per event and endpoint.

`costs` gains what a CostTrace now carries: API calls, sandbox seconds, the unit price applied and
whether the model was priced at all, the model, the skill, and the parent Run (child Runs' costs count
in their parent's total). Costs recorded before this migration keep their rows: they read as one API
call-less, sandbox-less, priced cost without a skill, exactly what they were. An index on
(tenant_id, at) serves the cost view's date ranges, one on runs.parent_run_id the walk from a Run to its
child Runs that a Run's total takes.

Revision ID: 0012_webhooks_costs
Revises: 0011_idempotency_scope
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0012_webhooks_costs"
down_revision = "0011_idempotency_scope"
branch_labels = None
depends_on = None

ID = sa.String(64)
#: MySQL's TEXT holds only 64 KB
TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
TABLE = "webhook_deliveries"


def _cost_columns() -> list[sa.Column[object]]:
    """The columns 0012 adds to `costs` (new objects per call: a Column belongs to one table)."""
    return [
        sa.Column("api_calls", sa.Integer, nullable=False, server_default="0"),
        sa.Column("sandbox_s", sa.Double, nullable=False, server_default="0"),
        sa.Column("skill_id", sa.String(128)),
        sa.Column("model", sa.String(128)),
        sa.Column("parent_run_id", ID),
        sa.Column("unit_price", sa.Text),
        sa.Column("priced", sa.Boolean, nullable=False, server_default=sa.true()),
    ]


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("delivery_id", ID, nullable=False, unique=True),
        sa.Column("event_id", ID, nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("run_id", ID),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("endpoint", sa.String(200), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("payload", TEXT, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.Double, nullable=False),
        sa.Column("lease_owner", sa.String(128)),
        sa.Column("lease_expires_at", sa.Double),
        sa.Column("last_status", sa.Integer),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("delivered_at", sa.Double),
        sa.UniqueConstraint("event_id", "endpoint", name="uq_webhook_event_endpoint"),
    )
    op.create_index("ix_webhook_due", TABLE, ["status", "next_attempt_at"])
    op.create_index("ix_webhook_tenant", TABLE, ["tenant_id", "status", "created_at"])
    for column in _cost_columns():
        op.add_column("costs", column)
    op.create_index("ix_costs_tenant_at", "costs", ["tenant_id", "at"])
    op.create_index("ix_runs_parent", "runs", ["parent_run_id"])


def downgrade() -> None:
    op.drop_index("ix_runs_parent", table_name="runs")
    op.drop_index("ix_costs_tenant_at", table_name="costs")
    for column in reversed(_cost_columns()):
        op.drop_column("costs", column.name)
    op.drop_index("ix_webhook_tenant", table_name=TABLE)
    op.drop_index("ix_webhook_due", table_name=TABLE)
    op.drop_table(TABLE)
