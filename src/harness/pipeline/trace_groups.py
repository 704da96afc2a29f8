"""A Run's trace as people read it: every record under the pipeline step it belongs to, the steps in the
order a Run goes through them (a human approval comes before the tools it approves), then the state
changes and the audit events. Every record lands in exactly one group, so the groups add up to the trace;
a step's own StepTrace (a record of its own in trace format 1, carried by the transition that ends the
step in format 2) is its group's `summary`.

Pure: the console and `harness trace` both group with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from harness.domain.traces import STEP, STEP_NAMES, step_entries

R = TypeVar("R")

#: the pipeline's steps in the order a Run passes them (a human approval comes before the tools it approves)
STEP_ORDER = (1, 2, 3, 4, 5, 7, 6, 8)
STEP_LABELS = {
    "create_run": "Create run",
    "assemble_context": "Assemble context",
    "load_skills": "Load skills",
    "plan": "Plan",
    "policy": "Policy",
    "hitl": "Human approval",
    "tools": "Tools",
    "trace": "Trace",
}
#: records that are not part of one step
OTHER_GROUPS = {"transition": "State changes", "audit": "Audit events"}
_STEP_OF_KIND = {"context": 2, "policy": 5, "tool": 6, "hitl": 7, "hitl_request": 7, "hitl_decision": 7,
                 "run": 8, "memory": 8}


def step_of(kind: str, data: Mapping[str, Any]) -> int | None:
    """The pipeline step (as recorded in step records) a record belongs to; None for state changes,
    audit events and kinds of no step."""
    if kind in (STEP, "error"):
        return int(data["step"])
    if kind == "cost":
        return 4 if str(data.get("source", "")).endswith(":plan") else 6
    if kind == "llm":
        return 4 if data.get("purpose") == "plan" else 6
    return _STEP_OF_KIND.get(kind)


@dataclass
class Group(Generic[R]):
    """The records of one step (number and step set), or of the state changes or audit events. A step's
    number is its place among the steps this trace shows, so the numbers never skip: a Run that needed no
    approval has its tools as step 6."""

    name: str
    label: str
    number: int | None = None
    step: int | None = None
    records: list[R] = field(default_factory=list)
    #: the step's StepTrace (every StepTrace field), when the trace holds one
    summary: dict[str, Any] | None = None


def group_records(records: Sequence[R], read: Callable[[R], tuple[str, Mapping[str, Any]]]) -> list[Group[R]]:
    """Every record in one group, groups in reading order; `read` gives a record's kind and payload."""
    steps: dict[int, Group[R]] = {}
    others: dict[str, Group[R]] = {}

    def step_group(step: int) -> Group[R]:
        name = STEP_NAMES[step]
        return steps.setdefault(step, Group(name, STEP_LABELS.get(name, name), None, step))

    for record in records:
        kind, data = read(record)
        step = step_of(kind, data)
        if step in STEP_NAMES:
            group = step_group(step)
        else:
            group = others.setdefault(kind, Group(kind, OTHER_GROUPS.get(kind, f"{kind} records")))
        group.records.append(record)
        for entry in step_entries(kind, data):
            if entry["step"] in STEP_NAMES:
                ended = step_group(entry["step"])
                if ended.summary is None:  # a step run again (a later round) shows its first StepTrace
                    ended.summary = entry
    ordered = [steps[s] for s in STEP_ORDER if s in steps]
    for number, group in enumerate(ordered, start=1):
        group.number = number
    rest = sorted(others.values(), key=lambda g: (g.name not in OTHER_GROUPS, list(OTHER_GROUPS).index(g.name)
                                                  if g.name in OTHER_GROUPS else 0, g.name))
    return ordered + rest
