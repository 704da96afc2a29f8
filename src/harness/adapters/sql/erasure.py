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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.blobs import blob_grants, blob_refs, blobs
from harness.adapters.sql.retention_schema import (
    archive_segments,
    archived_costs,
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
from harness.domain.retention import LiveErasure, hashes_in, redacted_payload, swap_ids
from harness.kernel.states import FINAL

USER_ERASED = "user_erased"
_FINAL = sorted(s.value for s in FINAL)
#: ids or hashes per IN list
_CHUNK = 500


def _chunks(values: Sequence[str]) -> Iterator[list[str]]:
    for i in range(0, len(values), _CHUNK):
        yield list(values[i : i + _CHUNK])


#: the tables an erasure deletes from or rewrites (what a VACUUM FULL / OPTIMIZE TABLE after it rewrites)
ERASED_TABLES = ("trace_records", "outbox", "runs", "transitions", "audit_events", "costs", "hitl_requests",
                 "hitl_decisions", "webhook_deliveries", "memory_entries", "blobs", "blob_refs", "sandbox_instances",
                 "spend_totals", "archived_runs", "archived_costs")


class EraseRefusedError(StoreError):
    """A record no longer matches its hash: nothing was erased (run `harness audit verify`)."""


class ErasureStore:
    """Erasure's reads and its write path over a SqlStore."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self._sqlite = store.engine.dialect.name == "sqlite"

    @contextmanager
    def _begin(self) -> Iterator[sa.Connection]:
        """A write transaction that, on SQLite, overwrites what it deletes or replaces with zeros
        (`secure_delete`) instead of leaving it in the file's free space; the connection goes back to the
        pool as it came."""
        with self.store.engine.connect() as conn:
            self._pragma(conn, "PRAGMA secure_delete = ON")
            try:
                with conn.begin():
                    yield conn
            finally:
                self._pragma(conn, "PRAGMA secure_delete = OFF")

    def _pragma(self, conn: sa.Connection, statement: str) -> Any:
        """On SQLite, run `statement` on the driver's connection, outside any transaction (the engine's
        BEGIN IMMEDIATE hook would open one); its first row."""
        if not self._sqlite:
            return None
        cursor = conn.connection.cursor()
        try:
            cursor.execute(statement)
            return cursor.fetchone()
        finally:
            cursor.close()

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
        self.store.drain_all()  # a record still in the outbox would be chained as it is, after the erasure
        for i in range(0, len(run_ids), 200):
            self._erase_batch(erase_id, salt, user_id, subject, list(run_ids[i : i + 200]), done)
        m = t.memory_entries
        with self._begin() as conn:
            gone = conn.execute(m.delete().where(m.c.tenant_id == tenant_id, sa.or_(
                m.c.user_id == user_id, m.c.source_run_id.in_(list(run_ids)) if run_ids else sa.false())))
            done.memory_entries = int(gone.rowcount)
            if self._sqlite and done.memory_entries:
                # the full-text index keeps a deleted entry's words until its segments are merged
                conn.exec_driver_sql("INSERT INTO memory_fts(memory_fts) VALUES ('optimize')")
            totals = t.spend_totals  # the person's total, every row of it, under the pseudonym
            rows = conn.execute(sa.select(totals).where(totals.c.tenant_id == tenant_id,
                                                        totals.c.user_id == user_id)).mappings().all()
            if rows:
                conn.execute(totals.delete().where(totals.c.tenant_id == tenant_id, totals.c.user_id == user_id))
                conn.execute(totals.insert(), [{**row, "user_id": subject} for row in rows])
            conn.execute(archived_costs.update().where(archived_costs.c.tenant_id == tenant_id,
                                                       archived_costs.c.user_id == user_id)
                         .values(user_id=subject))
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
        # what an approver wrote about the person's Run, and the actions put to them (the steps' arguments)
        decisions = t.hitl_decisions
        conn.execute(decisions.update().where(decisions.c.run_id.in_(ids), decisions.c.reason != "").values(reason=""))
        conn.execute(t.hitl_requests.update().where(t.hitl_requests.c.run_id.in_(ids))
                     .values(actions=canonical_json([])))
        conn.execute(t.sandbox_instances.update().where(t.sandbox_instances.c.run_id.in_(ids),
                                                        t.sandbox_instances.c.user_id == user_id)
                     .values(user_id=subject))

    def _erase_batch(self, erase_id: str, salt: bytes, user_id: str, subject: str, ids: list[str],
                     done: LiveErasure) -> None:
        with self._begin() as conn:
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
                done.contents |= hashes_in(r.payload)
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

    def erase_contents(self, run_ids: Sequence[str], hashes: set[str]) -> int:
        """Delete the blobs the Runs reference (their refs, and `hashes`, which their records named) that
        no other Run references, and the Runs' refs; returns how many blobs went. A blob another Run
        references too is that Run's content as well: it stays, no longer linked to these Runs."""
        ids, refs = sorted(set(run_ids)), blob_refs.c
        candidates = set(hashes)
        with self._begin() as conn:
            for chunk in _chunks(ids):
                candidates |= set(conn.execute(sa.select(refs.hash).where(refs.run_id.in_(chunk))).scalars())
            stored: set[str] = set()
            for chunk in _chunks(sorted(candidates)):
                stored |= set(conn.execute(sa.select(blobs.c.hash).where(blobs.c.hash.in_(chunk))).scalars())
            shared: set[str] = set()
            for chunk in _chunks(sorted(stored)):
                query = sa.select(refs.hash).where(refs.hash.in_(chunk))
                shared |= set(conn.execute(query.where(refs.run_id.not_in(ids)) if ids else query).scalars())
            gone = sorted(stored - shared)
            for chunk in _chunks(gone):
                conn.execute(blob_grants.insert(), [{"hash": h} for h in chunk])
                conn.execute(blobs.delete().where(blobs.c.hash.in_(chunk)))
                conn.execute(blob_grants.delete().where(blob_grants.c.hash.in_(chunk)))
            for chunk in _chunks(ids):
                conn.execute(blob_refs.delete().where(refs.run_id.in_(chunk)))
        return len(gone)

    def file_locations(self, run_ids: Sequence[str]) -> list[str]:
        """Where the files the Runs' sandboxed skills kept in a file store are: the `location` of each
        stored file document (harness.pipeline.artifacts) the Runs reference. Such a document is short; one
        that holds the bytes themselves (base64) does not match the pattern and is not read."""
        found: list[str] = []
        pattern = '{"artifact":"' + "_" * 64 + '","location":%'
        with self.store.engine.connect() as conn:
            for chunk in _chunks(sorted(set(run_ids))):
                query = (sa.select(blobs.c.content).join(blob_refs, blob_refs.c.hash == blobs.c.hash)
                         .where(blob_refs.c.run_id.in_(chunk), blobs.c.content.like(pattern)))
                found += [str(json.loads(text)["location"]) for text in conn.execute(query).scalars()]
        return sorted(set(found))

    def reclaim(self, *, vacuum: bool = True, vacuum_full: bool = False) -> list[str]:
        """Give back the space the erasure freed, so what it removed is not left in the database's free
        pages or log; returns what was done. SQLite (its deletes already zeroed by secure_delete): VACUUM
        rewrites the file without free pages (unless `vacuum` is False), and a checkpoint truncates the
        WAL. PostgreSQL: VACUUM FULL of the tables an erasure touches when `vacuum_full` (it locks them
        while it rewrites them), else nothing; MariaDB: OPTIMIZE TABLE likewise."""
        done: list[str] = []
        name = self.store.engine.dialect.name
        with self.store.engine.connect() as conn:
            if name == "sqlite":
                if vacuum:
                    self._pragma(conn, "VACUUM")
                    done.append("VACUUM")
                busy = self._pragma(conn, "PRAGMA wal_checkpoint(TRUNCATE)")
                done.append("wal_checkpoint(TRUNCATE)" + (" (busy: other connections still read)"
                                                           if busy and busy[0] else ""))
            elif vacuum_full:
                verb = "VACUUM FULL" if name == "postgresql" else "OPTIMIZE TABLE"
                raw = conn.execution_options(isolation_level="AUTOCOMMIT")
                for table in ERASED_TABLES:
                    raw.exec_driver_sql(f"{verb} {table}")
                done.append(f"{verb} of {len(ERASED_TABLES)} tables")
        return done

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
