"""The SQL side of the Run manager's writes beside transitions (ports.runs.RunWrites): LLM exchanges and
step contents with their blobs, the cost ledger, and transactions the manager opens itself."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from harness.adapters.sql.blobs import (
    BlobStore,
    contents_of,
    llm_call_record,
    put,
    record_llm_call,
    save_context_with_blobs,
)
from harness.adapters.sql.database import connection_of
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.store import SqlStore
from harness.domain.records import TraceRecordIn
from harness.domain.traces import CostTrace
from harness.kernel.states import RunState
from harness.ports import Tx


class SqlRunWrites:
    """RunWrites on the SQL store and its cost ledger."""

    def __init__(self, store: SqlStore, ledger: CostLedger) -> None:
        self.store = store
        self.ledger = ledger

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        with self.store.engine.begin() as conn:
            yield conn

    def lock_run(self, tx: Tx, run_id: str) -> RunState:
        return self.store.lock_run(connection_of(tx), run_id)

    def record_llm_call(self, run_id: str, purpose: str, request: Any, *, response: dict[str, Any] | None = None,
                        error: dict[str, Any] | None = None) -> None:
        record_llm_call(self.store, run_id, purpose, request, response=response, error=error)

    def llm_call(self, run_id: str, purpose: str, request: Any, *,
                 response: dict[str, Any]) -> tuple[TraceRecordIn, dict[str, str]]:
        record, values = llm_call_record(run_id, purpose, request, response=response)
        return record, contents_of(values)

    def put_contents(self, tx: Tx, contents: Mapping[str, str], run_id: str) -> None:
        put(connection_of(tx), contents, run_id)

    def insert_cost(self, tx: Tx, cost: CostTrace) -> None:
        self.ledger.insert(connection_of(tx), cost)

    def record_cost(self, cost: CostTrace) -> None:
        self.ledger.record(cost)

    def save_context(self, run_id: str, context: dict[str, Any] | None, records: Sequence[TraceRecordIn],
                     values: Iterable[Any], *, lease_epoch: int | None = None) -> bool:
        return save_context_with_blobs(self.store, run_id, context, records, values, lease_epoch=lease_epoch)

    def verified_content(self, digest: str) -> str | None:
        text = BlobStore(self.store.engine).raw([digest]).get(digest)
        return text if text is not None and BlobStore.verified(digest, text) else None
