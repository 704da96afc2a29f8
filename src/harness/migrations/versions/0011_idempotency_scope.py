"""Idempotency keys are scoped per (tenant, user) and bound to the request's body; health has a row to write.

- `runs.request_hash` (nullable): the digest of the request body an idempotency key was first used with,
  so the same key with another body is refused (409) instead of answered with the first Run. Runs created
  before this migration have none: their key keeps returning them, as it did.
- The unique key on (tenant_id, idempotency_key) becomes (tenant_id, user_id, idempotency_key): one
  user's key no longer finds another user's Run (and with it their task). Existing rows satisfy the
  narrower constraint, since they satisfied the wider one. SQLite cannot drop a table constraint, so
  there the runs table is rebuilt (Alembic's batch mode: create, copy every row unchanged, drop, rename)
  inside the migration's transaction; nothing references runs and it has no triggers.
- `health_heartbeat`: one row that `/health` updates to prove the database takes writes (a rolled-back
  write is not enough on SQLite, whose rolled-back transactions never touch the files).

Revision ID: 0011_idempotency_scope
Revises: 0009_approval_uniqueness
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_idempotency_scope"
down_revision = "0009_approval_uniqueness"
branch_labels = None
depends_on = None

OLD = "uq_runs_idempotency"
NEW = "uq_runs_idempotency_user"
HEARTBEAT = "health_heartbeat"


def upgrade() -> None:
    with op.batch_alter_table("runs", recreate="auto") as batch:
        batch.add_column(sa.Column("request_hash", sa.String(64)))
        batch.drop_constraint(OLD, type_="unique")
        batch.create_unique_constraint(NEW, ["tenant_id", "user_id", "idempotency_key"])
    op.create_table(
        HEARTBEAT,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("prober", sa.String(128), nullable=False),
    )
    op.execute(f"INSERT INTO {HEARTBEAT} (id, at, prober) VALUES (1, 0, 'migration')")


def downgrade() -> None:
    """Back to keys per tenant: fails (and changes nothing) if two users of a tenant now share a key."""
    op.drop_table(HEARTBEAT)
    with op.batch_alter_table("runs", recreate="auto") as batch:
        batch.drop_constraint(NEW, type_="unique")
        batch.create_unique_constraint(OLD, ["tenant_id", "idempotency_key"])
        batch.drop_column("request_hash")
