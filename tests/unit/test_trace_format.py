"""Trace format 2: a StepTrace rides in the record of the transition that ends its step, and reads back
with every field whichever format wrote it."""

from __future__ import annotations

from harness.domain.records import TraceRecordIn
from harness.domain.traces import STEP, fold_steps, step_entries, step_trace


def test_a_transitions_step_traces_fold_into_entries_and_the_rest_stay_records() -> None:
    """The Run's StepTraces become entries without kind, run id, name or an empty detail; a record of
    another kind, or a step record of another Run, stays a record of its own, in order."""
    ok = step_trace("r1", 2, {"in": 1}, {"out": 2}, 1.25).to_record()
    failed = step_trace("r1", 3, {}, {"error": "x"}, 0.0, "error", "boom").to_record()
    other_run = step_trace("r2", 2, {}, {}, 0.0).to_record()
    tool = TraceRecordIn("tool", {"step_id": "a"}, "r1")
    steps, rest = fold_steps("r1", [ok, tool, failed, other_run])
    assert rest == [tool, other_run]
    assert steps == [{"step": 2, "input_hash": ok.payload["input_hash"], "output_hash": ok.payload["output_hash"],
                      "duration_ms": 1.25, "status": "ok"},
                     {"step": 3, "input_hash": failed.payload["input_hash"],
                      "output_hash": failed.payload["output_hash"], "duration_ms": 0.0, "status": "error",
                      "detail": "boom"}]
    assert fold_steps("r1", [tool]) == ([], [tool])


def test_step_entries_read_both_formats_alike() -> None:
    """A format-1 step record and a format-2 transition entry of the same StepTrace read back the same."""
    record = step_trace("r1", 4, {"in": 1}, {"plan": []}, 3.5, detail="flattened").to_record()
    (entry,), _ = fold_steps("r1", [record])
    format_1 = {k: v for k, v in record.payload.items() if k != "run_id"}
    assert step_entries(STEP, format_1) == step_entries("transition", {"to": "POLICY_CHECK", "steps": [entry]})
    assert step_entries("transition", {"to": "EXECUTING"}) == [] and step_entries("tool", {"step": 4}) == []
    (read,) = step_entries("transition", {"steps": [entry]})
    assert read["name"] == "plan" and read["detail"] == "flattened" and read["duration_ms"] == 3.5
