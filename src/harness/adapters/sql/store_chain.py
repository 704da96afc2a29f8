"""The SQL store's trace: audit events, the outbox and its drain into the hash chain (SPEC A3, A4)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql import statements as q
from harness.adapters.sql.database import connection_of
from harness.adapters.sql.schema import digest_bytes, digest_hex
from harness.adapters.sql.store_base import (
    OutboxRow,
    StoreBase,
    stored_record,
    without_run_id,
)
from harness.domain.chain import canonical_json, record_hash
from harness.domain.ids import ordered_id
from harness.domain.records import (
    PendingRecord,
    StoredTraceRecord,
    TraceRecordIn,
)
from harness.ports import Tx

_log = logging.getLogger("harness.adapters.sql.store")


class TraceChain(StoreBase):
    """Audit events and trace records into the outbox, the outbox into the hash chain, the chain back out."""

    def _audit_row(
        self, conn: sa.Connection, run_id: str | None, event: str, actor: str, now: float, detail: dict[str, Any]
    ) -> TraceRecordIn:
        event_id = ordered_id()
        self._raw.later(conn, q.AUDIT_INSERT, {"event_id": event_id, "run_id": run_id, "event": event,
                                                 "actor": actor, "detail": canonical_json(detail), "at": now})
        return TraceRecordIn("audit", {"event_id": event_id, "event": event, "actor": actor, "detail": detail,
                                       "at": now}, run_id)

    def _audit(
        self, conn: sa.Connection, run_id: str | None, event: str, actor: str, now: float, detail: dict[str, Any]
    ) -> None:
        self.enqueue(conn, [self._audit_row(conn, run_id, event, actor, now, detail)], now)

    def write_audit(self, conn: sa.Connection, run_id: str | None, event: str, actor: str,
                    detail: dict[str, Any]) -> None:
        """Append one AuditLog event (and its trace record) inside the caller's transaction."""
        self._audit(conn, run_id, event, actor, self.clock.now(), detail)

    def audit(self, run_id: str | None, event: str, actor: str, detail: dict[str, Any]) -> None:
        """Append one AuditLog event (and its trace record) in its own transaction."""
        with self.engine.begin() as conn:
            self._audit(conn, run_id, event, actor, self.clock.now(), detail)

    # ------------------------------------------------------------------ the trace: outbox and chain

    def enqueue(self, conn: sa.Connection, records: Iterable[TraceRecordIn], now: float) -> None:
        """Write trace records to the outbox inside the caller's transaction.

        A payload's run_id equal to the record's is left out of the payload: the record's run_id column
        holds it, and the chain hashes that column, so it is as tamper-evident there and stored once.
        """
        rows = [
            {"record_id": r.record_id or ordered_id(), "run_id": r.run_id, "kind": r.kind,
             "payload": canonical_json(without_run_id(r.payload, r.run_id)), "created_at": now}
            for r in records
        ]
        if rows:
            self._raw.later_many(conn, q.OUTBOX_INSERT, rows)

    def record(self, records: Sequence[TraceRecordIn]) -> None:
        """Append trace records through the outbox, in their own transaction."""
        with self.engine.begin() as conn:
            self.enqueue(conn, records, self.clock.now())

    def chain_batch(self, conn: sa.Connection, records: Sequence[PendingRecord],
                    head: tuple[int, str | bytes] | None = None, chained: set[str] | None = None) -> int:
        """Append records to the hash chain inside the caller's transaction; returns how many were chained.

        Idempotent: a record already in the chain, or repeated in the batch (re-delivery), is skipped.
        Chainers exclude each other through the chain head (row lock, or SQLite's write lock), and a
        trigger refuses any record whose prev_hash is not the hash of the record at seq - 1 (migration
        0007), so concurrent chainers can never fork the chain. `chained`: which of the records the chain
        holds, when the caller read that with them (else it is read here).
        """
        seq, stored = head or self._raw.fetchone(conn, q.HEAD_LOCKED if self._locks_rows else q.HEAD)
        if not records:
            return 0
        # the head's hash as stored says the columns' form: 32 bytes from migration 0016 on, hex before
        # (a database an older replica still serves, or a test's at an earlier revision)
        stored_form = digest_bytes if isinstance(stored, (bytes, memoryview)) else str
        prev, prev_stored = digest_hex(stored), stored_form(stored)
        seen = self._already_chained(conn, records) if chained is None else set(chained)
        rows = []
        for r in records:
            if r.record_id in seen:
                continue
            seen.add(r.record_id)
            seq += 1
            digest = record_hash(seq, r.record_id, r.run_id, r.kind, prev, r.payload)
            digest_stored = stored_form(digest)
            rows.append({"seq": seq, "record_id": r.record_id, "run_id": r.run_id, "kind": r.kind,
                         "payload": r.payload, "prev_hash": prev_stored, "hash": digest_stored})
            prev, prev_stored = digest, digest_stored
        if rows:
            self._raw.later_many(conn, q.TRACE_INSERT, rows)
            self._raw.later(conn, q.HEAD_UPDATE, {"seq": seq, "hash": prev_stored})
        return len(rows)

    def _already_chained(self, conn: sa.Connection, records: Sequence[PendingRecord]) -> set[str]:
        """Which of these records the chain already holds (a re-delivery)."""
        if self._batches_by_array:  # one round trip for the batch, not one per record
            return {r[0] for r in self._raw.fetchall(conn, q.chained_ids_any(),
                                                     {"p_ids": [r.record_id for r in records]})}
        # in process (SQLite) one probe of the record_id index per record is cheaper than an IN list
        return {r.record_id for r in records
                if self._raw.fetchone(conn, q.CHAINED_ID, {"p_id": r.record_id}) is not None}

    def _drain_once(self, batch_size: int) -> tuple[int, int]:
        """Move up to `batch_size` outbox records into the hash chain; returns (chained, taken).

        A record already in the chain (re-delivery) is dropped from the outbox, not chained twice.
        The chain head is locked before the batch is read, so concurrent drainers take turns rather
        than reading the same rows.
        """
        with self.engine.begin() as conn:
            return self._drain_batch(conn, batch_size)

    def _drain_batch(self, conn: sa.Connection, batch_size: int,
                     locked: tuple[int, str | bytes] | None = None) -> tuple[int, int]:
        # the head, locked, then the batch: on PostgreSQL in one round trip. The server still runs them in
        # that order, so the batch's snapshot is taken with the lock held, as when each waited for the other.
        # `locked`: the head as this transaction already read and locked it
        if locked is not None:
            head, batch = locked, self._raw.fetchall(conn, q.OUTBOX_BATCH_CHAINED, {"p_limit": batch_size})
        else:
            heads, batch = self._raw.fetch_each(conn, (q.HEAD_LOCKED if self._locks_rows else q.HEAD, None),
                                                (q.OUTBOX_BATCH_CHAINED, {"p_limit": batch_size}))
            head = heads[0]
        pending = [OutboxRow(*r[:5]) for r in batch]
        if not pending:
            return 0, 0
        # the head just read (and, on a server, locked) is the one the batch chains onto; the batch's read
        # said which of its records the chain already holds
        chained = self.chain_batch(conn, [PendingRecord(p.record_id, p.run_id, p.kind, p.payload)
                                          for p in pending], head=(int(head[0]), head[1]),
                                   chained={r[1] for r in batch if r[5] is not None})
        if self._batches_by_array:
            self._raw.later(conn, q.outbox_delete_any(), {"p_ids": [p.id for p in pending]})
        elif not self._locks_rows:  # SQLite: nobody else writes while this transaction holds the write lock,
            # so the batch (the outbox's first rows, in id order) is exactly the rows from its first id to its last
            self._raw.later(conn, q.OUTBOX_DELETE_RANGE, {"p_first": pending[0].id, "p_last": pending[-1].id})
        else:
            self._raw.executemany(conn, q.OUTBOX_DELETE_ONE, [{"p_id": p.id} for p in pending])
        return chained, len(pending)

    def drain_within(self, tx: Tx, batch_size: int = 500, *, wait: bool = True) -> int:
        """Drain the outbox inside the caller's transaction (a Run's closing one: one commit fewer per
        Run), under a savepoint: a drain that fails rolls back alone, the caller's writes commit, and the
        records wait in the outbox for the next drain (A4: a failing trace store never blocks a Run).
        With a trace buffer the records go through the buffer instead, outside any transaction.

        `wait=False`: when another transaction holds the chain head (a server's row lock), drain nothing
        rather than wait for it; the records wait in the outbox for that drainer's next batch, the next
        close or the periodic drain. Closing Runs then do not queue one behind the other on the head."""
        if self.trace_buffer is not None:
            return 0
        conn = connection_of(tx)
        total = 0
        try:
            with self._raw.savepoint(conn, "harness_drain"):
                locked = None
                if not wait and self._locks_rows:
                    locked = self._raw.fetchone(conn, q.HEAD_LOCKED_UNLESS_BUSY)
                    if locked is None:  # another drainer holds the head: it, or the next, chains these
                        return 0
                while True:
                    chained, processed = self._drain_batch(conn, batch_size, locked)
                    locked = None  # the next batch reads the head this one moved (still locked: no wait)
                    total += chained
                    if processed < batch_size:
                        return total
        except sa.exc.SQLAlchemyError as exc:
            _log.warning("drain inside the closing transaction failed; the records stay in the outbox: %s", exc)
            return 0

    def pending_records(self, limit: int) -> list[PendingRecord]:
        """The oldest `limit` records waiting in the outbox, oldest first (what a trace buffer relays)."""
        with self.reader.connect() as conn:
            rows = conn.execute(q.OUTBOX_BATCH, {"p_limit": limit}).all()
        return [PendingRecord(r.record_id, r.run_id, r.kind, r.payload) for r in rows]

    def chain_records(self, records: Sequence[PendingRecord]) -> int:
        """Chain records that came through a trace buffer and drop their outbox rows, in one transaction;
        returns how many were chained (a re-delivered record is skipped)."""
        with self.engine.begin() as conn:
            chained = self.chain_batch(conn, records)
            if records:
                conn.execute(q.OUTBOX_DELETE_RECORDS, {"p_ids": [r.record_id for r in records]})
        return chained

    def drain(self, batch_size: int = 500) -> int:
        """Chain one batch of outbox records (through the trace buffer, if any); returns how many."""
        if self.trace_buffer is not None:
            return self.trace_buffer.drain(self, batch_size)
        return self._drain_once(batch_size)[0]

    def drain_all(self, batch_size: int = 500) -> int:
        """Drain until the outbox is empty (or, with a trace buffer, until nothing moves); returns how
        many records were chained."""
        if self.trace_buffer is not None:
            return self.trace_buffer.drain_all(self, batch_size)
        total = 0
        while True:
            chained, processed = self._drain_once(batch_size)
            total += chained
            if processed < batch_size:
                return total

    def outbox_backlog(self) -> int:
        """How many records wait in the outbox to be chained."""
        with self.reader.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(t.outbox)).scalar_one())

    def chain_head(self) -> tuple[int, str]:
        """(seq, hash) of the newest chained record, as the chain head table says."""
        with self.reader.connect() as conn:
            row = conn.execute(sa.select(t.chain_head.c.seq, t.chain_head.c.hash).where(t.chain_head.c.id == 1)).one()
        return int(row.seq), str(row.hash)

    def iter_trace(self, start_seq: int = 1, batch: int = 5000) -> Iterator[StoredTraceRecord]:
        """Every chained record from `start_seq`, in chain order, streamed in batches."""
        after = start_seq - 1
        while True:
            with self.reader.connect() as conn:  # on the cursor: a verify reads every record of the chain
                rows = self._raw.fetchall(conn, q.TRACE_AFTER, {"p_after": after, "p_limit": batch})
            if not rows:
                return
            for r in rows:
                yield stored_record(r)
            after = rows[-1][0]

    def trace_of(self, run_id: str) -> list[StoredTraceRecord]:
        """A Run's chained records, in chain order."""
        with self.reader.connect() as conn:
            rows = conn.execute(
                sa.select(t.trace_records).where(t.trace_records.c.run_id == run_id).order_by(t.trace_records.c.seq)
            ).all()
        return [StoredTraceRecord(r.seq, r.record_id, r.run_id, r.kind, r.payload, r.prev_hash, r.hash) for r in rows]
