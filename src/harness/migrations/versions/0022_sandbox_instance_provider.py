"""Which sandbox provider holds a kept instance's process: `sandbox_instances.provider`.

A kept instance started on a sandbox server (the remote provider) has a process on the server's host, not
on the harness host that leased it: its pid means nothing in this host's /proc. The pool asks the provider
that started it whether it still runs and asks it to stop it. Existing rows were all started by this
host's sandbox: "local".

Revision ID: 0022_sandbox_instance_provider
Revises: 0021_knowledge
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022_sandbox_instance_provider"
down_revision = "0021_knowledge"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sandbox_instances",
                  sa.Column("provider", sa.String(16), nullable=False, server_default="local"))


def downgrade() -> None:
    with op.batch_alter_table("sandbox_instances", recreate="auto") as batch:
        batch.drop_column("provider")
