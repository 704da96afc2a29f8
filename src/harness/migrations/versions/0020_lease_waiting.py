"""Whether a Run's driver was waiting when its lease was last renewed: `runs.lease_waiting`.

A takeover of an expired lease counts a stall, and a Run whose workers die `max_stalls` times is failed
as poison input. A process that dies while it waits for a model's answer, a skill or a child Run for this
Run was not killed by this Run: a service restarted three times under load used to fail the Runs that
were waiting at all three kills. The driver sets the flag (with a renewal) while its drive is switched out
on a wait outside the process, and clears it before its drive runs on; a takeover counts a stall only
when the flag is clear. Existing rows start clear (0): as before, every takeover of them counts.

Revision ID: 0020_lease_waiting
Revises: 0019_blob_refs
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_lease_waiting"
down_revision = "0019_blob_refs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("lease_waiting", sa.SmallInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("runs", recreate="auto") as batch:
        batch.drop_column("lease_waiting")
