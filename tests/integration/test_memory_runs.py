"""Memory through whole Runs: write-back only after SUCCEEDED, scoped recall, traced failures (SPEC C2-C5)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import sqlalchemy as sa

from harness.config import Runtime
from harness.context.errors import SecretFilterError
from harness.context.secrets import PatternDetector, SecretFilter, Span
from harness.memory.store import MemoryStore
from tests.acceptance.checks import assert_audit_clean, trace_kinds

TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


def memory_of(rt: Runtime) -> MemoryStore:
    """The runtime's memory store (memory is on by default)."""
    store = rt.runs.assembler.memory
    assert store is not None
    return store


def errors(rt: Runtime, run_id: str) -> list[str]:
    """Error codes in the Run's trace."""
    rt.store.drain_all()
    return [r.data()["error_code"] for r in rt.store.trace_of(run_id) if r.kind == "error"]


def test_a_succeeded_run_writes_memory_that_the_next_run_recalls(test_runtime: Runtime) -> None:
    """Success writes one summary (traced with the closing transition); the user's next Run recalls it."""
    first = test_runtime.runs.create_run({"task": "echo parcel for Lisbon", **TESS})
    assert first.state == "SUCCEEDED"
    written = memory_of(test_runtime).entries_of_run(first.run_id)
    assert len(written) == 1
    test_runtime.store.drain_all()
    records = [r.data() for r in test_runtime.store.trace_of(first.run_id) if r.kind == "memory"]
    assert records[0]["event"] == "write_back" and records[0]["stored"] == written
    second = test_runtime.runs.create_run({"task": "echo Lisbon parcel again", **TESS})
    context = test_runtime.runs.assembled_context(second.run_id)
    assert list(context.memory_ids) == written
    assert "Lisbon" in context.system_prompt
    assert_audit_clean(test_runtime)


def test_the_same_answer_twice_is_remembered_once(test_runtime: Runtime) -> None:
    """A user who repeats a Run keeps one memory of its answer: the second write-back stores nothing and
    its trace names the entry that already holds the content; the third Run recalls that entry once."""
    first = test_runtime.runs.create_run({"task": "echo parcel for Porto", **TESS})
    second = test_runtime.runs.create_run({"task": "echo parcel for Porto", **TESS})
    written = memory_of(test_runtime).entries_of_run(first.run_id)
    assert len(written) == 1 and memory_of(test_runtime).entries_of_run(second.run_id) == []
    test_runtime.store.drain_all()
    record = next(r.data() for r in test_runtime.store.trace_of(second.run_id) if r.kind == "memory")
    assert record["stored"] == [] and record["duplicate_of"] == written and record["entry_ids"] == written
    third = test_runtime.runs.create_run({"task": "echo parcel for Porto", **TESS})
    assert list(test_runtime.runs.assembled_context(third.run_id).memory_ids) == written
    assert_audit_clean(test_runtime)


@pytest.mark.parametrize(("task", "final"), [("fail", "CLOSED_FAILED"),
                                             ("echo DROP TABLE parcels", "CLOSED_REJECTED")])
def test_failed_and_rejected_runs_write_nothing(test_runtime: Runtime, task: str, final: str) -> None:
    """A Run that closes FAILED or REJECTED leaves no memory behind (C5)."""
    result = test_runtime.runs.create_run({"task": task, **TESS})
    assert result.state == final
    assert memory_of(test_runtime).entries_of_run(result.run_id) == []
    assert trace_kinds(test_runtime, result.run_id)["memory"] == 0


def test_a_cancelled_run_writes_nothing(test_runtime: Runtime) -> None:
    """A Run cancelled before it ran passes TRACING too, and still writes no memory (C5)."""
    run, _ = test_runtime.runs.submit({"task": "echo cancelled parcel", **TESS})
    result = test_runtime.runs.cancel(run.run_id, by="t1/tess")
    assert result.state == "CLOSED_CANCELLED"
    assert memory_of(test_runtime).entries_of_run(run.run_id) == []


@pytest.mark.parametrize("asked", [{"tenant_id": "t2"}, {"user_id": "lee"}])
def test_cross_tenant_and_cross_user_recall_fail_the_run(test_runtime: Runtime,
                                                          asked: dict[str, str]) -> None:
    """Asking for another tenant's or user's memory is FAILED with an ErrorTrace, before any model call."""
    result = test_runtime.runs.create_run({"task": "echo hi", "memory": asked, **TESS})
    assert list(result.path) == ["CREATED", "PREPARING", "FAILED", "TRACING", "CLOSED_FAILED"]
    assert "memory_scope_violation" in (result.error or "")
    assert errors(test_runtime, result.run_id) == ["memory_scope_violation"]
    assert trace_kinds(test_runtime, result.run_id)["cost"] == 0
    assert_audit_clean(test_runtime)


def test_a_broken_memory_degrades_the_run_instead_of_failing_it(test_runtime: Runtime) -> None:
    """With the memory index gone the Run still succeeds; recall and write-back failures are both traced."""
    with test_runtime.store.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE memory_fts"))
    result = test_runtime.runs.create_run({"task": "echo still works", **TESS})
    assert result.state == "SUCCEEDED" and result.answer == "still works"
    assert errors(test_runtime, result.run_id) == ["memory_recall_degraded", "memory_writeback_failed"]
    context = [r.data() for r in test_runtime.store.trace_of(result.run_id) if r.kind == "context"]
    assert "memory_fts" in context[0]["recall_degraded"]


class _Broken:
    name = "broken"

    def find(self, text: str) -> Iterable[Span]:
        raise RuntimeError("detector crashed")


def test_a_failing_secret_filter_refuses_the_run(test_runtime: Runtime) -> None:
    """If the filter cannot vouch for the request, it is refused at submit and nothing is created; if it
    cannot vouch for the context later, the Run is FAILED and the model is never called (C4)."""
    working = test_runtime.runs.assembler.filter
    test_runtime.runs.assembler.filter = SecretFilter([PatternDetector(), _Broken()])
    with pytest.raises(SecretFilterError, match="task: secret filter: detector broken failed"):
        test_runtime.runs.submit({"task": "echo hi", **TESS})
    assert test_runtime.store.list_runs() == []
    test_runtime.runs.assembler.filter = working
    run, _ = test_runtime.runs.submit({"task": "echo hi", **TESS})
    test_runtime.runs.assembler.filter = SecretFilter([PatternDetector(), _Broken()])
    result = test_runtime.runs.drive(run.run_id)
    assert result.state == "CLOSED_FAILED" and "secret_filter_failed" in (result.error or "")
    assert errors(test_runtime, result.run_id) == ["secret_filter_failed"]
    assert trace_kinds(test_runtime, result.run_id)["cost"] == 0


def test_a_history_whose_key_items_cannot_fit_refuses_the_run(test_runtime: Runtime) -> None:
    """Key items that do not fit the budget refuse the Run rather than answer without them (C3)."""
    history = [{"role": "user", "content": "You must never refund more than 40 EUR. " * 60}]
    result = test_runtime.runs.create_run({"task": "echo hi", "history": history, "token_budget": 600,
                                           **TESS})
    assert result.state == "CLOSED_FAILED" and "compression_refused" in (result.error or "")
    assert errors(test_runtime, result.run_id) == ["compression_refused"]
