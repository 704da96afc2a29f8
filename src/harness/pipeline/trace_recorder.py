"""Trace recorder (step ⑧, seed 004 §3.6): the typed trace records of SPEC A1.

Records are built here and written through the store's outbox — inside the transition they belong
to where there is one, so a state change and its trace are committed together (A4). The outbox is
drained into the hash chain in batches; see SqlStore.drain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from harness.domain.records import TraceRecordIn
from harness.domain.traces import TraceModel


class TraceOutbox(Protocol):
    """The part of the Run store the recorder writes to: the outbox, and draining it into the chain."""

    def record(self, records: Sequence[TraceRecordIn]) -> None: ...

    def drain_all(self, batch_size: int = ...) -> int: ...


class TraceRecorder:
    """Writes trace records outside a transition and drains the outbox into the chain."""

    def __init__(self, store: TraceOutbox) -> None:
        self.store = store

    def write(self, records: Sequence[TraceModel]) -> None:
        """Append records through the outbox in one transaction."""
        if records:
            self.store.record([r.to_record() for r in records])

    def flush(self) -> int:
        """Chain everything waiting in the outbox; returns the number chained."""
        return self.store.drain_all()
