"""One person counts once per approval request, enforced by the database (SPEC G4, amended G5).

`hitl_approvals` holds one row per accepted approval, UNIQUE on (request_id, approver): the decision's
own transaction inserts it, so two approvals by the same person, sent at once from several processes or
service replicas, can never both count, whatever a read before the transaction saw. `hitl_decisions`
stays the append-only record of every decision (refused ones included) and cannot carry the constraint
itself: a refused repeat must still be recorded.

Existing accepted approvals are copied in, the first of each (request, approver) pair only: a database
written before this revision may hold a duplicate (the race this revision closes), and it keeps being
visible in `hitl_decisions`. The table is append-only like the decisions it mirrors.

Revision ID: 0009_approval_uniqueness
Revises: 0008_spend_totals
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from harness.adapters.sql.triggers import append_only_ddl, drop_append_only_ddl

revision = "0009_approval_uniqueness"
down_revision = "0008_spend_totals"
branch_labels = None
depends_on = None

TABLE = "hitl_approvals"
BACKFILL = (
    f"INSERT INTO {TABLE} (request_id, approver, decision_id, at) "
    "SELECT d.request_id, d.approver, d.decision_id, d.at FROM hitl_decisions d WHERE d.id IN ("
    "SELECT MIN(id) FROM hitl_decisions WHERE decision = 'approve' AND outcome = 'accepted' "
    "GROUP BY request_id, approver)"
)


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("approver", sa.String(256), nullable=False),
        sa.Column("decision_id", sa.String(64), nullable=False),
        sa.Column("at", sa.Double, nullable=False),
        sa.UniqueConstraint("request_id", "approver", name="uq_hitl_approvals_person"),
    )
    op.execute(BACKFILL)
    for statement in append_only_ddl(op.get_bind().dialect.name, TABLE):
        op.execute(statement)


def downgrade() -> None:
    for statement in drop_append_only_ddl(op.get_bind().dialect.name, TABLE):
        op.execute(statement)
    op.drop_table(TABLE)
