"""A Run's start deadline: `runs.start_by`, the latest moment (the store's clock, seconds) the Run may start.

A Run in CREATED has not started: it waits in the queue, and nothing but its start deadline closes it (the
request's `start_by`, or the deployment's HARNESS_QUEUE_MAX_WAIT_S after acceptance). The sweeper finds the
Runs whose deadline passed with `state = 'CREATED' AND start_by < now` through the (state,
last_state_change_at) index's CREATED range, which admission control bounds (HARNESS_MAX_BACKLOG), so the
column needs no index of its own, and every transition keeps writing the indexes it wrote before. Runs
accepted before this migration have none (NULL): they wait as long as it takes, as they were promised.

Revision ID: 0017_start_by
Revises: 0016_binary_hashes
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_start_by"
down_revision = "0016_binary_hashes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("start_by", sa.Double))


def downgrade() -> None:
    with op.batch_alter_table("runs", recreate="auto") as batch:
        batch.drop_column("start_by")
