"""Child process of the witness race test: only what it needs is imported (processes start faster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit.checkpoint import publish_checkpoint
from harness.audit.witness import DirectoryWitness
from harness.clock import FakeClock
from harness.domain.records import NewRun, TraceRecordIn
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState as S


def publisher(url: str, witness_dir: str, local: str, barrier: Any, out: str) -> None:
    """Add a Run, then publish to its own folder and the shared witness, released with the others."""
    store = SqlStore.open(url, FakeClock())
    try:
        machine = StateMachine(store)
        run, _ = store.create_run(NewRun("acme", "ana", "s1", {"task": "t"}))
        state = S.CREATED
        for target in (S.PREPARING, S.FAILED):
            machine.transition(run.run_id, state, target, actor="test", reason="go")
            state = target
        store.record([TraceRecordIn("step", {"note": "race"}, run.run_id)])
        store.drain_all()
        barrier.wait()
        cp = publish_checkpoint(SqlAuditReads(store), Path(local), witnesses=[DirectoryWitness(Path(witness_dir))])
        Path(out).write_text(repr(cp.witnessed))
    finally:
        store.close()
