"""The audit's read port on the harness database (ports.audit.AuditReads): the chain with its tombstones,
the chain head, and the queries the verifier runs to find Runs that lost their trace."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.audit_mirrors import check_rows
from harness.adapters.sql.retention_schema import pruned_records, redacted_records
from harness.adapters.sql.store import SqlStore
from harness.domain.audit import REDACTED, ChainReport, PrunedRecord
from harness.domain.errors import StoreError
from harness.domain.records import RunRecord, StoredTraceRecord
from harness.ports import Clock


def iter_chain(store: SqlStore, batch: int = 5000) -> Iterator[StoredTraceRecord | PrunedRecord]:
    """Every position of the chain in seq order: the stored records, the tombstones of pruned ones, and
    for a record an erasure redacted, its original hashes (kind "redacted") in place of its content."""
    merged: Iterator[StoredTraceRecord | PrunedRecord] = heapq.merge(
        store.iter_trace(1, batch), _tombstones(store, pruned_records, batch), key=_seq)
    redactions = _tombstones(store, redacted_records, batch)
    upcoming = next(redactions, None)
    for rec in merged:
        while upcoming is not None and upcoming.seq < rec.seq:
            upcoming = next(redactions, None)
        if upcoming is not None and upcoming.seq == rec.seq and isinstance(rec, StoredTraceRecord):
            yield PrunedRecord(rec.seq, upcoming.hash, upcoming.leaf, rec.record_id, rec.run_id, REDACTED)
        else:
            yield rec


def _seq(rec: StoredTraceRecord | PrunedRecord) -> int:
    return rec.seq


def _tombstones(store: SqlStore, table: sa.Table, batch: int) -> Iterator[PrunedRecord]:
    """The table's tombstones in seq order; none on a database of a version before retention (verify and
    the migrations' tests read chains of every earlier schema)."""
    with store.reader.connect() as conn:
        if not sa.inspect(conn).has_table(table.name):
            return
    after = 0
    while True:
        with store.reader.connect() as conn:
            rows = conn.execute(sa.select(table.c.seq, table.c.hash, table.c.leaf).where(table.c.seq > after)
                                .order_by(table.c.seq).limit(batch)).all()
        if not rows:
            return
        for r in rows:
            yield PrunedRecord(int(r.seq), bytes(r.hash).hex(), bytes(r.leaf))
        after = rows[-1].seq


class SqlAuditReads:
    """AuditReads over a SqlStore."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    @property
    def clock(self) -> Clock:
        return self.store.clock

    def database_id(self) -> str:
        return self.store.database_id()

    def known_database_id(self) -> str | None:
        try:
            return self.store.database_id()
        except (sa.exc.SQLAlchemyError, StoreError):  # a revision before 0013 (opened without migrating)
            return None

    def drain_all(self) -> int:
        return self.store.drain_all()

    def chain_head(self) -> tuple[int, str]:
        return self.store.chain_head()

    def outbox_backlog(self) -> int:
        return self.store.outbox_backlog()

    def iter_chain(self) -> Iterator[StoredTraceRecord | PrunedRecord]:
        return iter_chain(self.store)

    def get_run(self, run_id: str) -> RunRecord:
        return self.store.get_run(run_id)

    def trace_of(self, run_id: str) -> list[StoredTraceRecord]:
        return self.store.trace_of(run_id)

    def redactions_of(self, run_id: str) -> dict[int, dict[str, str]]:
        x, rec = redacted_records.c, t.trace_records.c
        with self.store.reader.connect() as conn:
            if not sa.inspect(conn).has_table(redacted_records.name):
                return {}
            rows = conn.execute(sa.select(x.seq, x.erase_id, x.leaf).join(t.trace_records, rec.seq == x.seq)
                                .where(rec.run_id == run_id)).all()
        return {int(r.seq): {"erase_id": r.erase_id, "leaf": bytes(r.leaf).hex()} for r in rows}

    def pending_of_run(self, run_id: str) -> int:
        with self.store.reader.connect() as conn:
            query = sa.select(sa.func.count()).select_from(t.outbox).where(t.outbox.c.run_id == run_id)
            return int(conn.execute(query).scalar_one())

    def seq_with_hash(self, digest: str) -> int | None:
        return self._seq_where(t.trace_records.c.hash, digest)

    def seq_with_prev_hash(self, digest: str) -> int | None:
        return self._seq_where(t.trace_records.c.prev_hash, digest)

    def _seq_where(self, column: sa.Column[Any], digest: str) -> int | None:
        # neither hash column is indexed (migrations 0006, 0007): a scan of the table, done only to
        # explain a broken link that is listed (at most `limit` of them). A stored hash is a digest,
        # so a value that is not one is in no record
        try:
            bytes.fromhex(digest)
        except ValueError:
            return None
        with self.store.reader.connect() as conn:
            found = conn.execute(sa.select(t.trace_records.c.seq).where(column == digest)).first()
        return int(found.seq) if found else None

    def runs_with_untraced_transitions(self) -> list[tuple[str, int]]:
        def per_run(table: sa.Table, filtered: bool) -> sa.Subquery:
            query = sa.select(table.c.run_id, sa.func.count().label("n")).group_by(table.c.run_id)
            return (query.where(table.c.kind == "transition") if filtered else query).subquery()

        rows = per_run(t.transitions, False)
        traced, queued = per_run(t.trace_records, True), per_run(t.outbox, True)
        recorded = sa.func.coalesce(traced.c.n, 0) + sa.func.coalesce(queued.c.n, 0)
        query = (
            sa.select(rows.c.run_id, rows.c.n, recorded.label("recorded"))
            .outerjoin(traced, traced.c.run_id == rows.c.run_id)
            .outerjoin(queued, queued.c.run_id == rows.c.run_id)
            .where(recorded == 0)
            .order_by(rows.c.run_id)
        )
        with self.store.reader.connect() as conn:
            return [(str(r.run_id), int(r.n)) for r in conn.execute(query)]

    def runs_without_trace(self) -> list[str]:
        def has(table: sa.Table) -> sa.Exists:
            return sa.exists().where(table.c.run_id == t.runs.c.run_id)

        query = sa.select(t.runs.c.run_id).where(~has(t.trace_records), ~has(t.outbox), ~has(t.transitions))
        with self.store.reader.connect() as conn:
            return [str(r) for r in conn.execute(query.order_by(t.runs.c.run_id)).scalars()]

    def check_mirrors(self, report: ChainReport) -> None:
        check_rows(self.store, report)
