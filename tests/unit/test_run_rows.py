"""The rows a Run's writes are made of are built from their values alone (harness.adapters.sql.run_rows)."""

from __future__ import annotations

from harness.adapters.sql.run_rows import created_record, documents, new_run_row, transition_row
from harness.domain.records import UNSET, NewRun
from harness.kernel.states import RunState


def test_a_new_run_row_names_the_optional_columns_only_when_given() -> None:
    """A Run without a body hash or a start deadline inserts the columns it did before migration 0011."""
    bare = new_run_row(NewRun("t1", "u1", "s1", {"task": "x"}), 10.0, '{"task":"x"}')
    assert "request_hash" not in bare and "start_by" not in bare
    full = new_run_row(NewRun("t1", "u1", "s1", {}, request_hash="h", start_by=20.0), 10.0, "{}")
    assert (full["request_hash"], full["start_by"], full["state"]) == ("h", 20.0, RunState.CREATED.value)


def test_the_created_record_is_the_row_it_wrote() -> None:
    """The record returned without reading the row back holds the row's values."""
    new = NewRun("t1", "u1", "s1", {"task": "x"}, idempotency_key="k")
    row, record = new_run_row(new, 10.0, '{"task":"x"}'), created_record(new, 10.0, '{"task":"x"}')
    assert (record.run_id, record.state, record.version, record.created_at, record.idempotency_key) == (
        row["run_id"], RunState.CREATED, row["version"], row["created_at"], row["idempotency_key"])
    assert record.request == {"task": "x"}


def test_documents_write_only_what_is_given() -> None:
    """UNSET leaves a column as it is, None clears it, a value is written as canonical JSON."""
    assert documents(UNSET, UNSET, packs=False) == {}
    assert documents(None, {"b": 1, "a": 2}, packs=False) == {"context": None, "result": '{"a":2,"b":1}'}


def test_a_creation_has_no_source_state() -> None:
    """The transition row of a Run's creation has no from_state."""
    row = transition_row("r1", 0, None, RunState.CREATED, "run_manager", "run created", None, 1.0)
    assert row["from_state"] is None and row["to_state"] == RunState.CREATED.value
