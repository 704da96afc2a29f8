"""How people read a trace and its times: groups that add up, steps in the order a Run passes them,
deadlines as people say them, short ids that tell Runs apart."""

from __future__ import annotations

from typing import Any

from harness.domain.ids import ordered_id
from harness.pipeline.trace_groups import group_records
from harness.service.console_format import short
from harness.timefmt import approvals_needed, deadline_reason, human, parse_deadline_reason, span


def _rec(kind: str, **data: Any) -> dict[str, Any]:
    return {"kind": kind, **data}


def test_every_record_is_in_one_group_and_steps_follow_the_runs_order() -> None:
    """Transitions, audit events and kinds of no step get groups of their own after the steps; the
    approval (step 7 as recorded) comes before the tools it approves (recorded 6), and the steps shown are
    numbered 1, 2, 3, … in that order (this trace has no record of loading skills)."""
    records = [_rec("transition"), _rec("step", step=1), _rec("context"), _rec("step", step=2),
               _rec("llm", purpose="plan"), _rec("cost", source="llm:x:plan"), _rec("step", step=4),
               _rec("policy"), _rec("step", step=5), _rec("hitl"), _rec("hitl_request"), _rec("hitl_decision"),
               _rec("step", step=7), _rec("tool"), _rec("cost", source="skill:x"), _rec("step", step=6),
               _rec("run"), _rec("memory"), _rec("audit"), _rec("something_new")]
    groups = group_records(records, lambda r: (r["kind"], r))
    assert sum(len(g.records) for g in groups) == len(records)
    assert [(g.number, g.label) for g in groups] == [
        (1, "Create run"), (2, "Assemble context"), (3, "Plan"), (4, "Policy"), (5, "Human approval"),
        (6, "Tools"), (7, "Trace"), (None, "State changes"), (None, "Audit events"), (None, "something_new records")]
    assert [r["kind"] for r in groups[4].records] == ["hitl", "hitl_request", "hitl_decision", "step"]


def test_format_1_step_records_are_their_groups_summaries() -> None:
    """In a chain written before trace format 2, a step's own record is both in its group and its summary
    (every StepTrace field; the first of a step run twice)."""
    records = [_rec("step", step=4, name="plan", status="ok", duration_ms=1.5, detail=""),
               _rec("step", step=4, name="plan", status="error", duration_ms=2.0, detail="round 2")]
    (plan,) = group_records(records, lambda r: (r["kind"], r))
    assert plan.records == records
    assert plan.summary is not None and plan.summary["status"] == "ok" and plan.summary["duration_ms"] == 1.5


def test_format_2_steps_ride_in_transitions_and_summarise_their_groups() -> None:
    """A transition record carries the StepTraces of the steps it ends (trace format 2): the transition stays
    with the state changes, each step it ends gets its group and summary, even a step with no other record
    (create run, load skills), so the groups still add up to the records."""
    step = {"input_hash": "i" * 64, "output_hash": "o" * 64, "duration_ms": 0.0, "status": "ok"}
    records = [_rec("transition", to="PREPARING", steps=[{**step, "step": 1}]),
               _rec("transition", to="PLANNING", steps=[{**step, "step": 2, "duration_ms": 2.5},
                                                        {**step, "step": 3}]),
               _rec("context"), _rec("policy"),
               _rec("transition", to="FAILED", steps=[{**step, "step": 5, "status": "error", "detail": "boom"}])]
    groups = group_records(records, lambda r: (r["kind"], r))
    assert sum(len(g.records) for g in groups) == len(records)
    assert [(g.label, len(g.records)) for g in groups] == [
        ("Create run", 0), ("Assemble context", 1), ("Load skills", 0), ("Policy", 1), ("State changes", 3)]
    summaries = {g.step: g.summary for g in groups if g.step is not None}
    assert summaries[2] == {"step": 2, "name": "assemble_context", "input_hash": "i" * 64, "output_hash": "o" * 64,
                            "duration_ms": 2.5, "status": "ok", "detail": ""}
    assert summaries[5] is not None and summaries[5]["status"] == "error" and summaries[5]["detail"] == "boom"
    assert summaries[1] is not None and summaries[3] is not None and summaries[1]["name"] == "create_run"


def test_deadlines_read_as_people_say_them_in_old_and_new_records() -> None:
    """An approval request's recorded reason, ISO 8601 now and epoch seconds in older records, shows its
    deadline as a local time and how far off it is."""
    now = 1_796_197_864.0 - 59 * 60
    recorded = approvals_needed(1, 1_796_197_864.0)
    assert recorded == "1 approval needed by 2026-12-02T07:51:04Z"
    assert parse_deadline_reason(recorded) == (1, 1_796_197_864.0)
    for reason in (recorded, "1 approval(s) by 1796197864"):
        shown = deadline_reason(reason, now)
        assert shown.startswith("1 approval needed by ") and shown.endswith("(in 59 min)"), shown
        assert "1796197864" not in shown
    assert deadline_reason("demo", now) == "demo"
    assert human(now - 7200, now).endswith("(2 h ago)")
    assert [span(s) for s in (40, 3540, 3 * 3600 + 300, 2 * 86400 + 4 * 3600)] == ["40 s", "59 min", "3 h 5 min",
                                                                                  "2 d 4 h"]


def test_short_ids_of_runs_created_together_differ() -> None:
    """Time-ordered ids made in the same millisecond share their start; their short forms still differ."""
    ids = [ordered_id() for _ in range(50)]
    assert len({i.split("-")[0] for i in ids}) < 5
    shorts = {short(i) for i in ids}
    assert len(shorts) == 50 and all(i.replace("-", "").endswith(short(i)[1:]) for i in ids)
