"""The database side of retention: which Runs may go, what they hold, the audited prune, the tombstones.

The prune (`RetentionStore.prune`) is the only code that deletes from the append-only tables. In one
transaction per batch of Runs it grants the Runs (prune_grants), writes a tombstone per trace record
(its chain hash and Merkle leaf hash), deletes the Runs' rows and records, notes them in archived_runs,
revokes the grants and writes the `runs_pruned` audit event. A Run that gained a record after the
segment's checkpoint (or has one waiting in the outbox) is left in place and reported.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.retention_schema import (
    archive_segments,
    archived_runs,
    prune_grants,
    pruned_records,
)
from harness.adapters.sql.store import SqlStore
from harness.audit import merkle
from harness.domain.chain import record_bytes
from harness.domain.errors import StoreError
from harness.domain.records import StoredTraceRecord
from harness.kernel import FINAL

RUNS_PRUNED = "runs_pruned"
ARCHIVE_SEGMENT = "archive_segment"
#: the tables whose rows of a Run the segment carries (as read back by `--from-archive`) and prune deletes
RUN_TABLES = (t.transitions, t.audit_events, t.costs, t.hitl_decisions, t.hitl_requests, t.webhook_deliveries)
_FINAL = sorted(s.value for s in FINAL)


class PruneRefusedError(StoreError):
    """A Run's stored records no longer match their hashes: it is not pruned (run `harness audit verify`)."""


@dataclass(frozen=True, slots=True)
class ArchivedRun:
    """An archived, pruned Run and the segment that holds it."""

    run_id: str
    segment_id: str
    tenant_id: str
    state: str
    created_at: float
    closed_at: float
    archived_at: float
    location: str
    checkpoint: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document."""
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass
class PruneResult:
    """What one prune did."""

    runs: int = 0
    records: int = 0
    kept: list[str] = field(default_factory=list)


class RetentionStore:
    """Retention's reads and its one write path over a SqlStore."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        #: the chain as checkpoints read it (the archive publishes the checkpoint that proves a segment)
        self.chain = SqlAuditReads(store)

    # ------------------------------------------------------------------ choosing

    def eligible_runs(self, default_cutoff: float | None, tenant_cutoffs: Mapping[str, float | None],
                      limit: int) -> list[str]:
        """Final Runs whose last change is older than their tenant's cutoff (None: kept forever), oldest
        first, with every Run of their family (parent, children) final and old enough too."""
        runs = t.runs.c
        clauses = []
        for tenant, cutoff in tenant_cutoffs.items():
            if cutoff is not None:
                clauses.append(sa.and_(runs.tenant_id == tenant, runs.last_state_change_at < cutoff))
        if default_cutoff is not None:
            clauses.append(sa.and_(runs.tenant_id.not_in(list(tenant_cutoffs)) if tenant_cutoffs else sa.true(),
                                   runs.last_state_change_at < default_cutoff))
        if not clauses:
            return []
        query = (sa.select(runs.run_id, runs.parent_run_id).where(runs.state.in_(_FINAL), sa.or_(*clauses))
                 .order_by(runs.last_state_change_at, runs.run_id).limit(limit))
        with self.store.reader.connect() as conn:
            rows = conn.execute(query).all()
            chosen = {r.run_id for r in rows}
            parents = {r.run_id: r.parent_run_id for r in rows}
            children = conn.execute(sa.select(runs.run_id, runs.parent_run_id)
                                    .where(runs.parent_run_id.in_(list(chosen)))).all() if chosen else []
        # a Run goes with its whole family or not at all: cost totals and commitments span it
        kids: dict[str, set[str]] = {}
        for r in children:
            kids.setdefault(r.parent_run_id, set()).add(r.run_id)
        changed = True
        while changed:
            changed = False
            for run_id in sorted(chosen):
                parent = parents.get(run_id)
                if (parent is not None and parent not in chosen and self._exists(parent)) or \
                        not kids.get(run_id, set()) <= chosen:
                    chosen.discard(run_id)
                    changed = True
        return [r.run_id for r in rows if r.run_id in chosen]

    def _exists(self, run_id: str) -> bool:
        with self.store.reader.connect() as conn:
            return conn.execute(sa.select(t.runs.c.run_id).where(t.runs.c.run_id == run_id)).first() is not None

    # ------------------------------------------------------------------ reading what goes

    def bundle(self, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Per Run: its runs row, its job row, its rows of RUN_TABLES and its chained records."""
        out: dict[str, dict[str, Any]] = {r: {"tables": {}, "records": []} for r in run_ids}
        with self.store.reader.connect() as conn:
            for row in conn.execute(sa.select(t.runs).where(t.runs.c.run_id.in_(run_ids))).mappings():
                out[row["run_id"]]["run"] = dict(row)
            for row in conn.execute(sa.select(t.jobs).where(t.jobs.c.job_id.in_(run_ids))).mappings():
                out[row["job_id"]]["job"] = dict(row)
            for table in RUN_TABLES:
                for row in conn.execute(sa.select(table).where(table.c.run_id.in_(run_ids))
                                        .order_by(*table.primary_key.columns)).mappings():
                    out[row["run_id"]]["tables"].setdefault(table.name, []).append(dict(row))
            query = sa.select(t.trace_records).where(t.trace_records.c.run_id.in_(run_ids)).order_by(
                t.trace_records.c.seq)
            for r in conn.execute(query):
                out[r.run_id]["records"].append(
                    StoredTraceRecord(r.seq, r.record_id, r.run_id, r.kind, r.payload, r.prev_hash, r.hash))
        return out

    def pending_of(self, run_ids: Sequence[str]) -> set[str]:
        """The Runs among `run_ids` with records still waiting in the outbox."""
        with self.store.reader.connect() as conn:
            return set(conn.execute(sa.select(t.outbox.c.run_id).where(t.outbox.c.run_id.in_(run_ids))
                                    .distinct()).scalars())

    def manifest_record(self, after_seq: int, segment_id: str) -> StoredTraceRecord | None:
        """The chained `archive_segment` audit record of `segment_id` (chained after `after_seq`)."""
        for rec in self.store.iter_trace(after_seq + 1):
            if rec.run_id is None and rec.kind == "audit" and ARCHIVE_SEGMENT in rec.payload:
                detail = rec.data().get("detail", {})
                if rec.data().get("event") == ARCHIVE_SEGMENT and detail.get("segment_id") == segment_id:
                    return rec
        return None

    # ------------------------------------------------------------------ segments

    def add_segment(self, segment_id: str, location: str, runs: int, records: int, digest: str, tree_size: int,
                    checkpoint: str) -> None:
        """Note a stored segment (not yet pruned)."""
        with self.store.engine.begin() as conn:
            conn.execute(archive_segments.insert().values(
                segment_id=segment_id, location=location, runs=runs, records=records, digest=digest,
                tree_size=tree_size, checkpoint=checkpoint, created_at=self.store.clock.now()))

    def segments(self) -> list[dict[str, Any]]:
        """Every segment, oldest first."""
        with self.store.reader.connect() as conn:
            return [dict(r) for r in conn.execute(sa.select(archive_segments)
                                                  .order_by(archive_segments.c.created_at)).mappings()]

    def archived(self, run_id: str) -> ArchivedRun | None:
        """Where an archived Run is, or None when the Run was never archived."""
        query = (sa.select(archived_runs, archive_segments.c.location, archive_segments.c.checkpoint)
                 .join(archive_segments, archive_segments.c.segment_id == archived_runs.c.segment_id)
                 .where(archived_runs.c.run_id == run_id))
        with self.store.reader.connect() as conn:
            row = conn.execute(query).mappings().first()
        return ArchivedRun(**{k: row[k] for k in ArchivedRun.__slots__}) if row else None

    # ------------------------------------------------------------------ the prune

    def prune(self, segment_id: str, run_ids: Sequence[str], tree_size: int, actor: str,
              batch: int = 500) -> PruneResult:
        """Delete the Runs (already in segment `segment_id`, proven against a checkpoint of `tree_size`),
        keeping a tombstone per record; batches of `batch` Runs, one transaction each."""
        result = PruneResult()
        for i in range(0, len(run_ids), batch):
            self._prune_batch(segment_id, list(run_ids[i : i + batch]), tree_size, actor, result)
        with self.store.engine.begin() as conn:
            conn.execute(archive_segments.update().where(archive_segments.c.segment_id == segment_id)
                         .values(pruned_at=self.store.clock.now()))
        return result

    def _prune_batch(self, segment_id: str, run_ids: list[str], tree_size: int, actor: str,
                     result: PruneResult) -> None:
        now = self.store.clock.now()
        with self.store.engine.begin() as conn:
            rows = conn.execute(sa.select(t.runs).where(t.runs.c.run_id.in_(run_ids))
                                .with_for_update()).mappings().all()
            late = set(conn.execute(sa.select(t.outbox.c.run_id).where(t.outbox.c.run_id.in_(run_ids))).scalars())
            late |= set(conn.execute(sa.select(t.trace_records.c.run_id).where(
                t.trace_records.c.run_id.in_(run_ids), t.trace_records.c.seq > tree_size)).scalars())
            late |= {r["run_id"] for r in rows if r["state"] not in _FINAL}
            runs = [r for r in rows if r["run_id"] not in late]
            result.kept += sorted(late & set(run_ids))
            ids = [r["run_id"] for r in runs]
            if not ids:
                return
            conn.execute(prune_grants.insert(), [{"run_id": r, "segment_id": segment_id} for r in ids])
            tombstones = self._tombstones(conn, ids)
            if tombstones:
                conn.execute(pruned_records.insert(), tombstones)
            requests = sa.select(t.hitl_requests.c.request_id).where(t.hitl_requests.c.run_id.in_(ids))
            conn.execute(t.hitl_approvals.delete().where(t.hitl_approvals.c.request_id.in_(requests)))
            for table in (*RUN_TABLES, t.trace_records):
                conn.execute(table.delete().where(table.c.run_id.in_(ids)))
            conn.execute(t.jobs.delete().where(t.jobs.c.job_id.in_(ids)))
            conn.execute(t.runs.delete().where(t.runs.c.run_id.in_(ids)))
            conn.execute(archived_runs.insert(), [
                {"run_id": r["run_id"], "segment_id": segment_id, "tenant_id": r["tenant_id"], "user_id": r["user_id"],
                 "state": r["state"],
                 "created_at": r["created_at"], "closed_at": r["last_state_change_at"], "archived_at": now}
                for r in runs])
            conn.execute(prune_grants.delete().where(prune_grants.c.segment_id == segment_id))
            self.store.write_audit(conn, None, RUNS_PRUNED, actor, {
                "segment_id": segment_id, "runs": len(ids), "records": len(tombstones),
                "first_run": ids[0], "last_run": ids[-1]})
        result.runs += len(ids)
        result.records += len(tombstones)

    def _tombstones(self, conn: sa.Connection, run_ids: list[str]) -> list[dict[str, Any]]:
        out = []
        query = sa.select(t.trace_records).where(t.trace_records.c.run_id.in_(run_ids))
        for r in conn.execute(query):
            data = record_bytes(r.seq, r.record_id, r.run_id, r.kind, r.prev_hash, r.payload)
            digest = hashlib.sha256(data).digest()
            if digest.hex() != r.hash:
                raise PruneRefusedError(f"record seq {r.seq} of run {r.run_id} no longer matches its hash: "
                                        "nothing was pruned; run `harness audit verify`")
            out.append({"seq": r.seq, "hash": digest, "leaf": merkle.leaf_hash(data)})
        return out
