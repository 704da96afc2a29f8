"""Long-term memory write-back, only from the TRACING of a SUCCEEDED Run (SPEC C5).

Registered with `StateMachine.on_close`: the hook runs while the Run is in TRACING, just before its
final state, and writes only when that final state is SUCCEEDED. Failed, cancelled, rejected and
timed-out Runs write nothing. The entry id is derived from the Run id, so a hook that runs twice
stores one entry. Entries of a Run count in recall only once the Run is SUCCEEDED in the database
(MemoryScope.clause), which covers a crash between this hook and the final state's commit.
A write-back failure never blocks the Run from closing: it is traced as an ErrorTrace.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from harness.domain.chain import content_hash
from harness.domain.records import RunRecord, TraceRecordIn
from harness.domain.traces import error_trace
from harness.kernel.states import RunState
from harness.memory.scope import ScopeLevel
from harness.memory.store import MemoryStore, NewMemory

#: the longest artifacts summary a run-summary entry keeps
MAX_ARTIFACTS_CHARS = 1_500
_NAMESPACE = uuid.UUID("6f1c2d4e-8a51-4c3b-9d0e-5b7a2f3c4d61")


def summary_of(run: RunRecord) -> str:
    """What a succeeded Run leaves in memory: its task, its answer and a compact view of its results."""
    request, result = run.request, run.result or {}
    parts = [f"Task: {request.get('task', '')}"]
    if result.get("answer"):
        parts.append(f"Answer: {result['answer']}")
    artifacts = result.get("artifacts")
    if artifacts:
        text = json.dumps(artifacts, sort_keys=True, separators=(",", ":"), default=str)
        cut = text if len(text) <= MAX_ARTIFACTS_CHARS else text[:MAX_ARTIFACTS_CHARS] + "..."
        parts.append(f"Results: {cut}")
    return "\n".join(parts)


class MemoryWriteBack:
    """The closing hook that writes a succeeded Run's summary into the caller's memory."""

    def __init__(self, memory: MemoryStore, scope: ScopeLevel = "user") -> None:
        self.memory = memory
        self.scope = scope

    def __call__(self, run: RunRecord, final: RunState) -> Sequence[TraceRecordIn]:
        """Write back when `final` is SUCCEEDED; the trace records to commit with the final state."""
        if final != RunState.SUCCEEDED:
            return []
        try:
            entry = self._entry(run)
            ids = self.memory.add([entry])
        except Exception as exc:  # a memory outage must not keep the Run from closing
            return [error_trace(run.run_id, 8, "memory_writeback_failed", exc).to_record()]
        # `add` answers with the existing entry's id when the scope already remembers the same content
        stored = [i for i in ids if i == entry.entry_id]
        return [TraceRecordIn("memory", {
            "run_id": run.run_id, "event": "write_back", "scope": self.scope, "entry_ids": ids,
            "stored": stored, "duplicate_of": [i for i in ids if i not in stored],
            "content_hash": content_hash(self.memory.filter.scrub(entry.content).text),
        }, run.run_id)]

    def _entry(self, run: RunRecord) -> NewMemory:
        request: dict[str, Any] = run.request
        return NewMemory(
            tenant_id=run.tenant_id, scope=self.scope, content=summary_of(run), user_id=run.user_id,
            session_id=run.session_id, team_id=request.get("team_id"), kind="run_summary",
            source_run_id=run.run_id, entry_id=str(uuid.uuid5(_NAMESPACE, f"{run.run_id}:summary")),
        )
