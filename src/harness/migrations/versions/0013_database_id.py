"""A database id, an outbox index by Run, and the chained mirrors of existing approval rows (SPEC A1-A3b).

- `database_identity` holds one row: the id written when the database is created (or, for a database
  created before this revision, when it is upgraded). Checkpoints name it, so a checkpoint of another
  database is told apart from tampering, and the default checkpoint directory is per database. A copy
  of a database (a restored backup) keeps the id: it holds the same chain.
- `ix_outbox_run`: closing a Run lists its records still in the outbox (the RunTrace commits to every
  record of the Run); without the index that is a scan of the whole backlog, which grows while a trace
  buffer is down.
- Approval requests and decisions are chained as their own records from this version on
  (harness.audit.mirror_records); the rows that exist already get theirs here, through the outbox, so
  `harness audit verify` checks every row from the upgrade on.

Revision ID: 0013_database_id
Revises: 0012_webhooks_costs
Create Date: 2026-12-03
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from alembic import op

from harness.audit import mirror_records
from harness.domain.chain import canonical_json
from harness.domain.ids import ordered_id

revision = "0013_database_id"
down_revision = "0012_webhooks_costs"
branch_labels = None
depends_on = None

TABLE = "database_identity"
INDEX = "ix_outbox_run"

_outbox = sa.table("outbox", sa.column("record_id"), sa.column("run_id"), sa.column("kind"),
                   sa.column("payload"), sa.column("created_at"))
_requests = sa.table("hitl_requests", *(sa.column(c) for c in (
    "request_id", "run_id", "tenant_id", "requester", "level", "required_approvals", "approver_roles",
    "actions_hash", "status", "created_at", "deadline_at", "decided_at", "escalated_from")))
_decisions = sa.table("hitl_decisions", *(sa.column(c) for c in (
    "id", "decision_id", "request_id", "run_id", "approver", "decision", "actions_hash", "break_glass",
    "reason", "outcome", "refusal", "at")))


def _mirrors(conn: sa.Connection, now: float) -> list[dict[str, Any]]:
    """One outbox row per existing approval request, then per decision, oldest first."""
    rows = []
    sources = ((_requests, _requests.c.created_at, mirror_records.HITL_REQUEST, mirror_records.hitl_request),
               (_decisions, _decisions.c.id, mirror_records.HITL_DECISION, mirror_records.hitl_decision))
    for table, order, kind, payload in sources:
        for row in conn.execute(sa.select(table).order_by(order)).mappings():
            rows.append({"record_id": ordered_id(), "run_id": row["run_id"], "kind": kind,
                         "payload": canonical_json(payload(row)), "created_at": now})
    return rows


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("database_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
    )
    now = time.time()
    conn = op.get_bind()
    conn.execute(sa.table(TABLE, sa.column("id"), sa.column("database_id"), sa.column("created_at")).insert(),
                 [{"id": 1, "database_id": ordered_id(), "created_at": now}])
    op.create_index(INDEX, "outbox", ["run_id"])
    mirrors = _mirrors(conn, now)
    if mirrors:
        conn.execute(_outbox.insert(), mirrors)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="outbox")
    op.drop_table(TABLE)
