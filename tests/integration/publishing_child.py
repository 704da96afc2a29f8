"""Helpers of the checkpoint publishing tests, light enough for child processes to import quickly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit.publisher import CheckpointPublisher
from harness.clock import FakeClock
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState as S


def grow(store: SqlStore) -> None:
    """Add one failed Run to the chain and chain it."""
    machine = StateMachine(store)
    run, _ = store.create_run(NewRun("acme", "ana", "s1", {"task": "t"}))
    machine.transition(run.run_id, S.CREATED, S.PREPARING, actor="test", reason="go")
    machine.transition(run.run_id, S.PREPARING, S.FAILED, actor="test", reason="stop")
    store.drain_all()


def replica(url: str, folder: str, barrier: Any, out: str) -> None:
    """Child process: a replica whose checkpoint is due, released together with the others."""
    store = SqlStore.open(url, FakeClock())
    try:
        publisher = CheckpointPublisher(SqlAuditReads(store), interval_s=3600, directory=Path(folder))
        barrier.wait()
        published = publisher.publish_if_due()
        Path(out).write_text(repr(published.path if published else None))
    finally:
        store.close()
