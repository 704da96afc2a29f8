"""Recorded costs (budgets) and human approval requests and decisions (SPEC G1, G3-G6).

Revision ID: 0002_gatekeeper
Revises: 0001_kernel
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from harness.adapters.sql.triggers import append_only_ddl, drop_append_only_ddl

revision = "0002_gatekeeper"
down_revision = "0001_kernel"
branch_labels = None
depends_on = None

ID = sa.String(64)
#: MySQL's TEXT holds only 64 KB
TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "costs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("input_tokens", sa.Integer, nullable=False),
        sa.Column("output_tokens", sa.Integer, nullable=False),
        sa.Column("usd", sa.Double, nullable=False),
        sa.Column("at", sa.Double, nullable=False),
    )
    op.create_index("ix_costs_user", "costs", ["tenant_id", "user_id"])
    op.create_index("ix_costs_run", "costs", ["run_id"])
    op.create_table(
        "hitl_requests",
        sa.Column("request_id", ID, primary_key=True),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("requester", sa.String(128), nullable=False),
        sa.Column("level", sa.String(4), nullable=False),
        sa.Column("required_approvals", sa.Integer, nullable=False),
        sa.Column("approver_roles", TEXT, nullable=False),
        sa.Column("actions", TEXT, nullable=False),
        sa.Column("actions_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("deadline_at", sa.Double, nullable=False),
        sa.Column("decided_at", sa.Double),
        sa.Column("escalated_from", ID),
    )
    op.create_index("ix_hitl_requests_status", "hitl_requests", ["status", "deadline_at"])
    op.create_index("ix_hitl_requests_run", "hitl_requests", ["run_id"])
    op.create_index("ix_hitl_requests_requester", "hitl_requests", ["tenant_id", "requester", "status"])
    op.create_table(
        "hitl_decisions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("decision_id", ID, nullable=False, unique=True),
        sa.Column("request_id", ID, nullable=False),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("approver", sa.String(256), nullable=False),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("actions_hash", sa.String(64), nullable=False),
        sa.Column("break_glass", sa.Boolean, nullable=False),
        sa.Column("reason", TEXT, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("refusal", TEXT),
        sa.Column("at", sa.Double, nullable=False),
    )
    op.create_index("ix_hitl_decisions_request", "hitl_decisions", ["request_id"])
    for table in ("costs", "hitl_decisions"):
        for statement in append_only_ddl(op.get_bind().dialect.name, table):
            op.execute(statement)


def downgrade() -> None:
    for table in ("costs", "hitl_decisions"):
        for statement in drop_append_only_ddl(op.get_bind().dialect.name, table):
            op.execute(statement)
    for table in ("hitl_decisions", "hitl_requests", "costs"):
        op.drop_table(table)
