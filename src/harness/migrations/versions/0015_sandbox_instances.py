"""Sandbox instances and their leases (seed 004 §3.4-3.5): sandboxes as a scarce, shared resource.

- `sandbox_instances`: one row per (Run, skill that keeps an instance): where it lives (host, the pid of
  its namespace's first process and that process's start time, so a reused pid is not taken for it),
  its leased ports, how often it was (re)created, and its state (live, released, dead). Any process
  sharing the database sees it: the console, the metrics, the sweeper of another process.
- `sandbox_leases`: the scarce units, one row each, keyed by (resource, unit): a port of a host's pool
  (`port:<host>`, unit = the port), a slot of a host's cap (`host:<host>`) or of a tenant's
  (`tenant:<tenant>`). The primary key makes taking a unit atomic on every backend: two processes
  that race for the last one cannot both insert it.

Revision ID: 0015_sandbox_instances
Revises: 0014_retention
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_sandbox_instances"
down_revision = "0014_retention"
branch_labels = None
depends_on = None

ID = sa.String(64)


def upgrade() -> None:
    op.create_table(
        "sandbox_instances",
        sa.Column("instance_id", ID, primary_key=True),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("skill_id", sa.String(128), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("isolation", sa.String(16), nullable=False),
        sa.Column("pid", sa.Integer),
        sa.Column("pid_start", sa.BigInteger),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("ports", sa.String(400), nullable=False, server_default=""),
        sa.Column("generation", sa.Integer, nullable=False, server_default="1"),
        sa.Column("calls", sa.Integer, nullable=False, server_default="0"),
        sa.Column("persistent", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("held_s", sa.Double, nullable=False, server_default="0"),
        sa.Column("billed", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("used_at", sa.Double, nullable=False),
        sa.Column("lease_expires_at", sa.Double, nullable=False),
        sa.Column("ended_at", sa.Double),
        sa.Column("end_reason", sa.String(200)),
        sa.UniqueConstraint("run_id", "skill_id", name="uq_sandbox_instance_run_skill"),
    )
    op.create_index("ix_sandbox_instances_state", "sandbox_instances", ["state", "host"])
    op.create_table(
        "sandbox_leases",
        sa.Column("resource", sa.String(160), primary_key=True),
        sa.Column("unit", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("instance_id", ID, nullable=False),
        sa.Column("acquired_at", sa.Double, nullable=False),
    )
    op.create_index("ix_sandbox_leases_instance", "sandbox_leases", ["instance_id"])


def downgrade() -> None:
    op.drop_index("ix_sandbox_leases_instance", table_name="sandbox_leases")
    op.drop_table("sandbox_leases")
    op.drop_index("ix_sandbox_instances_state", table_name="sandbox_instances")
    op.drop_table("sandbox_instances")
