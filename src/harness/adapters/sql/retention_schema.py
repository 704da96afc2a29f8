"""Tables of retention (migration 0014): what the archive moved out, and what the database keeps of it."""

from __future__ import annotations

import sqlalchemy as sa

from harness.adapters.sql.schema import ID, STATE, metadata

#: a Run whose rows the running prune transaction may delete (harness.adapters.sql.prune_triggers)
prune_grants = sa.Table(
    "prune_grants",
    metadata,
    sa.Column("run_id", ID, primary_key=True),
    sa.Column("segment_id", ID, nullable=False),
)

#: a pruned trace record: its chain hash (the next record links to it) and its Merkle leaf hash (the
#: signed tree heads cover it), 32 bytes each; the record itself is in its archive segment
pruned_records = sa.Table(
    "pruned_records",
    metadata,
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("hash", sa.LargeBinary(32), nullable=False),
    sa.Column("leaf", sa.LargeBinary(32), nullable=False),
)

#: one archive segment: where it is, what it holds, the digest its chained manifest record signs
archive_segments = sa.Table(
    "archive_segments",
    metadata,
    sa.Column("segment_id", ID, primary_key=True),
    sa.Column("location", sa.String(1024), nullable=False),
    sa.Column("runs", sa.Integer, nullable=False),
    sa.Column("records", sa.Integer, nullable=False),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("tree_size", sa.BigInteger, nullable=False),
    sa.Column("checkpoint", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("pruned_at", sa.Double),
)

#: a Run that was archived and pruned: enough to say so, and where to read it back
archived_runs = sa.Table(
    "archived_runs",
    metadata,
    sa.Column("run_id", ID, primary_key=True),
    sa.Column("segment_id", ID, nullable=False),
    sa.Column("tenant_id", sa.String(128), nullable=False),
    sa.Column("state", STATE, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("closed_at", sa.Double, nullable=False),
    sa.Column("archived_at", sa.Double, nullable=False),
    #: whose Run it was, to find it on an erasure request (then replaced by the subject's pseudonym)
    sa.Column("user_id", sa.String(128), nullable=False),
    sa.Index("ix_archived_runs_segment", "segment_id"),
    sa.Index("ix_archived_runs_user", "tenant_id", "user_id"),
)

#: a trace record whose payload an erasure replaced: its original chain and leaf hashes (what the chain
#: and the signed tree heads still commit to), and the erasure that did it
redacted_records = sa.Table(
    "redacted_records",
    metadata,
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("hash", sa.LargeBinary(32), nullable=False),
    sa.Column("leaf", sa.LargeBinary(32), nullable=False),
    sa.Column("erase_id", ID, nullable=False),
)

#: one honoured erasure request; `subject` is the salted hash that replaced the person's id
erasures = sa.Table(
    "erasures",
    metadata,
    sa.Column("erase_id", ID, primary_key=True),
    sa.Column("subject", sa.String(128), nullable=False),
    sa.Column("runs", sa.Integer, nullable=False),
    sa.Column("records", sa.Integer, nullable=False),
    sa.Column("memory_entries", sa.Integer, nullable=False),
    sa.Column("archived_runs", sa.Integer, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
)

#: a live Run whose personal data an erasure replaced (its rows are no longer checked against records)
erased_runs = sa.Table(
    "erased_runs",
    metadata,
    sa.Column("run_id", ID, primary_key=True),
    sa.Column("erase_id", ID, nullable=False),
)

#: what the costs of a segment's pruned Runs added to the spend totals, per tenant and user (migration
#: 0018): reconcile adds these to the live costs' sums, so a prune leaves the totals reconciling. Written
#: by the prune in the transaction that deletes the costs, from the rows it deletes once they agreed with
#: the cost records the segment proves; an erasure re-keys the person's rows to their pseudonym.
archived_costs = sa.Table(
    "archived_costs",
    metadata,
    sa.Column("segment_id", ID, primary_key=True),
    sa.Column("tenant_id", sa.String(128), primary_key=True),
    sa.Column("user_id", sa.String(128), primary_key=True),
    sa.Column("usd", sa.Double, nullable=False),
    sa.Column("cost_count", sa.BigInteger, nullable=False),
)
