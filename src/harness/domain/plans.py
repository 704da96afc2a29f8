"""The model's plan for a round (step ④): its steps and their tool calls, the references between their
outputs (`{"$ref": "order.total"}`), and the answer template filled from those outputs.

Every model forbids unknown fields, so a malformed plan fails with a message naming the field instead of
being half-understood.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from harness.domain.contracts import SKILL_ID, Contract

STEP_ID = r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$"


class Ref(Contract):
    """A reference to an earlier step's output: `{"$ref": "order.total"}`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    ref: str = Field(alias="$ref", pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


class ToolCall(Contract):
    """One call of a skill with its (possibly referencing) arguments."""

    skill: Annotated[str, Field(pattern=SKILL_ID)]
    arguments: dict[str, Any] = Field(default_factory=dict)


class PlanStep(Contract):
    """One step of a plan: its goal, its tool call, what it depends on and where its output goes."""

    id: Annotated[str, Field(pattern=STEP_ID)]
    goal: str = Field(default="", max_length=2_000)
    tool_call: ToolCall
    depends_on: tuple[str, ...] = ()
    output_key: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class BudgetEstimate(Contract):
    """The model's estimate of what the plan will cost."""

    tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0)


#: what happens once a plan's steps have run: "finish" answers with `answer` or the rendered
#: `answer_template`; "answer" has the model write the answer from the results; "next_round" shows the
#: model the results and asks it for the next round's plan
Then = Literal["finish", "answer", "next_round"]


class Plan(Contract):
    """The model's plan (step ④) for one round: steps with tool calls, a dependency DAG, output keys, a
    budget, and what happens after them. A plan with no steps is a direct answer."""

    steps: tuple[PlanStep, ...] = Field(default=(), max_length=64)
    answer: str | None = Field(default=None, max_length=20_000)
    answer_template: str = Field(default="", max_length=10_000)
    then: Then = "finish"
    budget_estimate: BudgetEstimate = BudgetEstimate()
    requires_authorization: bool = False

    @model_validator(mode="after")
    def _unique_ids_and_keys(self) -> Plan:
        ids = [s.id for s in self.steps]
        if len(set(ids)) != len(ids):
            raise ValueError(f"step ids must be unique, got {ids}")
        keys = [s.output_key for s in self.steps]
        if len(set(keys)) != len(keys):
            raise ValueError(f"output keys must be unique, got {keys}")
        if not self.steps:
            if self.then != "finish":
                raise ValueError(f'a plan with no steps is a direct answer: "then" must be "finish", not {self.then!r}')
            if not (self.answer or "").strip():
                raise ValueError("a plan with no steps is a direct answer and needs a non-empty \"answer\"")
        return self


def refs_in(value: Any) -> list[str]:
    """Every `$ref` path inside an argument value."""
    if isinstance(value, dict):
        if set(value) == {"$ref"} and isinstance(value["$ref"], str):
            return [value["$ref"]]
        return [r for v in value.values() for r in refs_in(v)]
    if isinstance(value, list):
        return [r for v in value for r in refs_in(v)]
    return []


_TEMPLATE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)\}")


def lookup_path(outputs: dict[str, Any], path: str) -> Any:
    """Resolve `key.field.sub` in step outputs; KeyError names the missing part."""
    head, *rest = path.split(".")
    if head not in outputs:
        raise KeyError(f"no output named {head!r}")
    value = outputs[head]
    for part in rest:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(f"{path!r}: no field {part!r}")
    return value


def render_template(template: str, outputs: dict[str, Any]) -> str:
    """Fill `{key.field}` placeholders from step outputs."""
    return _TEMPLATE.sub(lambda m: str(lookup_path(outputs, m.group(1))), template)
