"""The content-addressed blob store: what the trace references by hash, kept so a Run can be replayed (A5).

Trace records carry hashes of inputs and outputs (A1); the contents live here, keyed by the same
hash (SHA-256 of the canonical JSON, harness.domain.chain.content_hash), and are written in the same
transaction as the records that reference them — a record is never committed pointing at content
that was not. Equal contents share one row. Reading back verifies the hash, so an edited blob is
reported, never silently replayed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.database import read_only, read_retried
from harness.adapters.sql.raw import statements_for
from harness.adapters.sql.store import SqlStore
from harness.domain.chain import canonical_json, content_hash, text_hash
from harness.domain.records import TraceRecordIn

blobs = sa.Table(
    "blobs",
    t.metadata,
    sa.Column("hash", sa.String(64), primary_key=True),
    sa.Column("content", t.LongText(), nullable=False),
)

#: which Run references which blob (migration 0019): blobs are shared, so an erasure deletes only the
#: contents no other Run references; kept when a Run is pruned (its blobs stay, and so must the link)
blob_refs = sa.Table(
    "blob_refs",
    t.metadata,
    sa.Column("hash", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Index("ix_blob_refs_run", "run_id"),
)

#: a blob the running erasure transaction may delete (harness.adapters.sql.blob_guards)
blob_grants = sa.Table("blob_grants", t.metadata, sa.Column("hash", sa.String(64), primary_key=True))


def contents_of(values: Iterable[Any]) -> dict[str, str]:
    """hash → canonical JSON for each value (the hash the trace records carry for it)."""
    texts = [canonical_json(v) for v in values]
    return {text_hash(text): text for text in texts}


@cache
def _insert_new(dialect: str, table: sa.Table, keys: tuple[str, ...]) -> sa.Insert:
    """Insert-unless-present on `dialect`, built once per dialect (with that dialect's module alone: the
    engine has imported it already): equal contents share one row."""
    if dialect == "sqlite":
        from sqlalchemy.dialects import sqlite

        return sqlite.insert(table).on_conflict_do_nothing(index_elements=list(keys))
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table).on_conflict_do_nothing(index_elements=list(keys))
    return table.insert().prefix_with("IGNORE")  # MySQL / MariaDB


def put(conn: sa.Connection, contents: Mapping[str, str], run_id: str | None) -> None:
    """Insert blobs, and that `run_id` references them, inside the caller's transaction; one already
    stored is left as it is. Nothing reads the inserts' results, so on PostgreSQL they wait for the
    transaction's next statement or its commit and go in one round trip with it (an error, as any, rolls
    the transaction back)."""
    if not contents:
        return
    raw = statements_for(conn.dialect)
    rows = [{"hash": h, "content": c} for h, c in sorted(contents.items())]
    raw.later_many(conn, _insert_new(conn.dialect.name, blobs, ("hash",)), rows)
    if run_id is not None:
        refs = [{"hash": h, "run_id": run_id} for h in sorted(contents)]
        raw.later_many(conn, _insert_new(conn.dialect.name, blob_refs, ("hash", "run_id")), refs)


def record_with_blobs(store: SqlStore, records: Sequence[TraceRecordIn], values: Iterable[Any]) -> None:
    """Append trace records and the contents they reference by hash, in one transaction."""
    with store.engine.begin() as conn:
        put(conn, contents_of(values), records[0].run_id if records else None)
        store.enqueue(conn, records, store.clock.now())


def save_context_with_blobs(store: SqlStore, run_id: str, context: dict[str, Any] | None,
                            records: Sequence[TraceRecordIn], values: Iterable[Any], *,
                            lease_epoch: int | None = None) -> bool:
    """SqlStore.save_context (the RunContext and its trace records in one transaction), plus the
    contents those records reference, in that same transaction; False when fenced by `lease_epoch`."""
    contents = contents_of(values)
    return store.save_context(run_id, context, records, also=lambda conn: put(conn, contents, run_id),
                              lease_epoch=lease_epoch)


class BlobStore:
    """Reads blobs back, checking each against its hash."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def available(self) -> bool:
        """Whether this database has the blob table at all (a database from before 0004_blobs has not)."""
        return sa.inspect(self.engine).has_table("blobs")

    def raw(self, hashes: Iterable[str]) -> dict[str, str]:
        """The stored text of each hash that has a blob, unchecked."""
        wanted = sorted(set(hashes))
        if not wanted:
            return {}
        query = sa.select(blobs.c.hash, blobs.c.content).where(blobs.c.hash.in_(wanted))
        # autocommit on PostgreSQL (no BEGIN, no ROLLBACK), without a ping: a read that can run twice
        rows = read_retried(read_only(self.engine), lambda conn: conn.execute(query).all())
        return {r.hash: r.content for r in rows}

    @staticmethod
    def verified(digest: str, text: str) -> bool:
        """Whether `text` is exactly the canonical JSON whose hash is `digest`."""
        return hashlib.sha256(text.encode("utf-8")).hexdigest() == digest


def llm_call_record(run_id: str, purpose: str, request: Any, *, response: dict[str, Any] | None = None,
                    error: dict[str, Any] | None = None) -> tuple[TraceRecordIn, list[Any]]:
    """The "llm" trace record of one exchange — request and response by hash, an error inline, a
    fallback switch when the response came from the fallback model — and the contents it references."""
    answer = response or {}
    payload = {
        "purpose": purpose, "request_hash": content_hash(request),
        "response_hash": content_hash(response) if response is not None else None, "error": error,
        "provider": answer.get("provider"), "model": answer.get("model"),
        "fallback_from": answer.get("fallback_from"), "fallback_reason": answer.get("fallback_reason"),
    }
    # None fields are left out (trace format 2): a plain answer carries no error and no fallback
    payload = {k: v for k, v in payload.items() if v is not None}
    return TraceRecordIn("llm", payload, run_id), ([request] if response is None else [request, response])


def record_llm_call(store: SqlStore, run_id: str, purpose: str, request: Any, *,
                    response: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> None:
    """Trace one LLM exchange with its contents, in its own transaction."""
    record, values = llm_call_record(run_id, purpose, request, response=response, error=error)
    record_with_blobs(store, [record], values)
