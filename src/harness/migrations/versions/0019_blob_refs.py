"""Whose Runs reference a blob: `blob_refs`, and a door in the blobs' DELETE guard for an erasure.

Blobs are content-addressed and shared: equal contents (a system prompt, a common answer) are one row
whatever Runs reference them. An erasure request must delete the contents of the person's Runs but not
what other people's Runs still reference, so every blob written from now on notes the Run that wrote it
(`blob_refs`, one row per hash and Run, kept when the Run is archived and pruned so an erasure of an
archived Run still finds its contents). The upgrade fills `blob_refs` for the records in the database:
every blob hash a record's payload names. `blob_grants` is the erasure's door in the append-only guard
(harness.adapters.sql.blob_guards).

Revision ID: 0019_blob_refs
Revises: 0018_archived_costs
Create Date: 2026-12-05
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

from harness.adapters.sql.blob_guards import erasable_blobs_ddl, plain_blobs_ddl

revision = "0019_blob_refs"
down_revision = "0018_archived_costs"
branch_labels = None
depends_on = None

_HASH = re.compile(r"[0-9a-f]{64}")
_BATCH = 2000


def upgrade() -> None:
    op.create_table("blob_refs",
                    sa.Column("hash", sa.String(64), primary_key=True),
                    sa.Column("run_id", sa.String(64), primary_key=True))
    op.create_index("ix_blob_refs_run", "blob_refs", ["run_id"])
    op.create_table("blob_grants", sa.Column("hash", sa.String(64), primary_key=True))
    conn = op.get_bind()
    for statement in erasable_blobs_ddl(conn.dialect.name):
        op.execute(statement)
    _backfill(conn)


def _backfill(conn: sa.Connection) -> None:
    """A ref for every blob hash a chained record's payload names, a batch of records at a time."""
    after = 0
    while True:
        rows = conn.execute(sa.text("SELECT seq, run_id, payload FROM trace_records WHERE seq > :a "
                                    "AND run_id IS NOT NULL ORDER BY seq LIMIT :n"), {"a": after, "n": _BATCH}).all()
        if not rows:
            return
        after = int(rows[-1][0])
        named = {(h, r[1]) for r in rows for h in _HASH.findall(r[2])}
        hashes = sorted({h for h, _ in named})
        stored: set[str] = set()
        for i in range(0, len(hashes), 500):
            chunk = hashes[i : i + 500]
            stored |= set(conn.execute(sa.text("SELECT hash FROM blobs WHERE hash IN :h")
                                       .bindparams(sa.bindparam("h", expanding=True)), {"h": chunk}).scalars())
        refs = sorted((h, run) for h, run in named if h in stored)
        if refs:
            have = set()
            for i in range(0, len(refs), 500):
                chunk = sorted({h for h, _ in refs[i : i + 500]})
                have |= {(a, b) for a, b in conn.execute(
                    sa.text("SELECT hash, run_id FROM blob_refs WHERE hash IN :h")
                    .bindparams(sa.bindparam("h", expanding=True)), {"h": chunk})}
            new = [{"h": h, "r": run} for h, run in refs if (h, run) not in have]
            if new:
                conn.execute(sa.text("INSERT INTO blob_refs (hash, run_id) VALUES (:h, :r)"), new)


def downgrade() -> None:
    for statement in plain_blobs_ddl(op.get_bind().dialect.name):
        op.execute(statement)
    op.drop_table("blob_grants")
    op.drop_index("ix_blob_refs_run", "blob_refs")
    op.drop_table("blob_refs")
