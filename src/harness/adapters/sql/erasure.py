"""The database side of an erasure request (`harness erase --user U`).

Personal data, for this purpose, is everything a person's Runs hold and the person's id wherever the
database keys on it:

- a Run they own: `runs.user_id`, `session_id`, `idempotency_key`, `request` (task, history, metadata),
  `context` and `result` (replaced); in its rows the person's id as transition and audit actor, cost owner,
  approval requester or approver, and `user_id` / `session_id` in audit details (pseudonymised); its
  webhook deliveries (deleted: they carry the task and the answer); and every trace record of the Run,
  whose payload is replaced whole by `{"erased": <erase id>, "salted_sha256": SHA-256(salt || payload)}`;
- their memory entries (their user and session scopes, and any entry their Runs wrote back): deleted;
- their running spend totals: re-keyed to the pseudonym;
- their archived Runs: the same, in a rewritten segment (harness.retention.erase).

The person's id is replaced by a salted hash (the pseudonym, `erased-<hex>`): the same for all of their
rows, so counts and totals still add up, and unlinkable to them once the salt is gone. A redacted record
keeps its seq, ids, kind, link and chain hash; its original chain and leaf hashes are kept in
`redacted_records`, so the chain and every signed tree head still verify. The one UPDATE the append-only
guards allow is this one (harness.adapters.sql.prune_triggers): payload only, for a granted Run, with
its redaction recorded first.

Not covered: the person's id where it appears in other people's Runs (as an approver, say), and run-less
audit events. Both stay as they were.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.retention_schema import (
    archive_segments,
    archived_runs,
    erased_runs,
    erasures,
    prune_grants,
    redacted_records,
)
from harness.adapters.sql.store import SqlStore
from harness.audit import merkle
from harness.domain.chain import canonical_json, record_bytes
from harness.domain.errors import StoreError
from harness.domain.retention import LiveErasure, redacted_payload, swap_ids
from harness.kernel import FINAL

USER_ERASED = "user_erased"
_FINAL = sorted(s.value for s in FINAL)


class EraseRefusedError(StoreError):
    """A record no longer matches its hash: nothing was erased (run `harness audit verify`)."""


class ErasureStore:
    """Erasure's reads and its write path over a SqlStore."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def runs_of(self, tenant_id: str, user_id: str) -> tuple[list[str], list[str]]:
        """(final, not final) Runs the person owns in the database."""
        query = sa.select(t.runs.c.run_id, t.runs.c.state).where(t.runs.c.tenant_id == tenant_id,
                                                                   t.runs.c.user_id == user_id)
        with self.store.reader.connect() as conn:
            rows = conn.execute(query.order_by(t.runs.c.run_id)).all()
        return [r.run_id for r in rows if r.state in _FINAL], [r.run_id for r in rows if r.state not in _FINAL]

    def archived_of(self, tenant_id: str, user_id: str) -> dict[str, list[str]]:
        """segment_id -> the person's archived Runs in it."""
        query = sa.select(archived_runs.c.segment_id, archived_runs.c.run_id).where(
            archived_runs.c.tenant_id == tenant_id, archived_runs.c.user_id == user_id)
        out: dict[str, list[str]] = {}
        with self.store.reader.connect() as conn:
            for r in conn.execute(query.order_by(archived_runs.c.run_id)):
                out.setdefault(r.segment_id, []).append(r.run_id)
        return out

    def erase_live(self, erase_id: str, salt: bytes, tenant_id: str, user_id: str, subject: str,
                   run_ids: Sequence[str]) -> LiveErasure:
        """Redact the Runs' records and rows, delete the person's memory, re-key their spend totals."""
        done = LiveErasure()
        for i in range(0, len(run_ids), 200):
            self._erase_batch(erase_id, salt, user_id, subject, list(run_ids[i : i + 200]), done)
        m = t.memory_entries
        with self.store.engine.begin() as conn:
            gone = conn.execute(m.delete().where(m.c.tenant_id == tenant_id, sa.or_(
                m.c.user_id == user_id, m.c.source_run_id.in_(list(run_ids)) if run_ids else sa.false())))
            done.memory_entries = int(gone.rowcount)
            totals = t.spend_totals
            row = conn.execute(sa.select(totals).where(totals.c.tenant_id == tenant_id,
                                                       totals.c.user_id == user_id)).mappings().first()
            if row is not None:
                conn.execute(totals.delete().where(totals.c.tenant_id == tenant_id, totals.c.user_id == user_id))
                conn.execute(totals.insert().values({**row, "user_id": subject}))
        return done

    def _pseudonymise_rows(self, conn: sa.Connection, ids: list[str], user_id: str, subject: str) -> None:
        """The person's id becomes the pseudonym in the Runs' rows (the counts and totals still add up);
        their pushed payloads, which carry the task and the answer, are deleted."""
        for table, column in ((t.transitions, "actor"), (t.audit_events, "actor"), (t.costs, "user_id"),
                              (t.hitl_requests, "requester"), (t.hitl_decisions, "approver")):
            conn.execute(table.update().where(table.c.run_id.in_(ids), table.c[column] == user_id)
                         .values({column: subject}))
        a = t.audit_events
        rows = conn.execute(sa.select(a.c.event_id, a.c.detail).where(a.c.run_id.in_(ids))).all()
        changed = [{"p_id": r.event_id, "p_detail": canonical_json(swap_ids(json.loads(r.detail), user_id, subject))}
                   for r in rows if user_id in r.detail]
        if changed:
            conn.execute(a.update().where(a.c.event_id == sa.bindparam("p_id"))
                         .values(detail=sa.bindparam("p_detail")), changed)
        conn.execute(t.webhook_deliveries.delete().where(t.webhook_deliveries.c.run_id.in_(ids)))

    def _erase_batch(self, erase_id: str, salt: bytes, user_id: str, subject: str, ids: list[str],
                     done: LiveErasure) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(prune_grants.insert(), [{"run_id": r, "segment_id": f"erase:{erase_id}"} for r in ids])
            records = conn.execute(sa.select(t.trace_records).where(t.trace_records.c.run_id.in_(ids))
                                   .order_by(t.trace_records.c.seq)).all()
            tombstones, payloads = [], []
            for r in records:
                data = record_bytes(r.seq, r.record_id, r.run_id, r.kind, r.prev_hash, r.payload)
                digest = hashlib.sha256(data).digest()
                if digest.hex() != r.hash:
                    raise EraseRefusedError(f"record seq {r.seq} of run {r.run_id} no longer matches its hash: "
                                            "nothing was erased; run `harness audit verify`")
                tombstones.append({"seq": r.seq, "hash": digest, "leaf": merkle.leaf_hash(data),
                                   "erase_id": erase_id})
                payloads.append({"p_seq": r.seq, "p_payload": redacted_payload(salt, erase_id, r.payload)})
            if tombstones:
                conn.execute(redacted_records.insert(), tombstones)
                conn.execute(t.trace_records.update().where(t.trace_records.c.seq == sa.bindparam("p_seq"))
                             .values(payload=sa.bindparam("p_payload")), payloads)
            self._pseudonymise_rows(conn, ids, user_id, subject)
            stub = canonical_json({"erased": erase_id})
            conn.execute(t.runs.update().where(t.runs.c.run_id.in_(ids)).values(
                user_id=subject, session_id=subject, idempotency_key=None, request=stub, context=None,
                result=None, request_hash=None))
            conn.execute(erased_runs.insert(), [{"run_id": r, "erase_id": erase_id} for r in ids])
            conn.execute(prune_grants.delete().where(prune_grants.c.segment_id == f"erase:{erase_id}"))
        done.runs += len(ids)
        done.records += len(tombstones)

    def archived_erased(self, run_ids: Sequence[str], subject: str, segment_id: str, location: str) -> None:
        """The person's archived Runs now carry the pseudonym, and their segment's new location."""
        with self.store.engine.begin() as conn:
            conn.execute(archived_runs.update().where(archived_runs.c.run_id.in_(list(run_ids)))
                         .values(user_id=subject))
            conn.execute(sa.text("UPDATE archive_segments SET location = :l WHERE segment_id = :s"),
                         {"l": location, "s": segment_id})

    def note(self, erase_id: str, subject: str, counts: dict[str, Any], actor: str) -> None:
        """The erasure's own row and its audit event (which names the pseudonym, never the person)."""
        with self.store.engine.begin() as conn:
            conn.execute(erasures.insert().values(erase_id=erase_id, subject=subject, runs=counts["runs"],
                                                  records=counts["records"], memory_entries=counts["memory_entries"],
                                                  archived_runs=counts["archived_runs"], at=self.store.clock.now()))
            self.store.write_audit(conn, None, USER_ERASED, actor, {"erase_id": erase_id, "subject": subject,
                                                                     **counts})

    def segment_locations(self) -> dict[str, str]:
        """segment_id -> where the segment is stored now."""
        with self.store.reader.connect() as conn:
            return {r.segment_id: r.location for r in conn.execute(
                sa.select(archive_segments.c.segment_id, archive_segments.c.location))}
