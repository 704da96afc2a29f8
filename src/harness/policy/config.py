"""The declarative policy file (structural, budget and guardrail rules; HITL settings)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.domain.errors import PolicyConfigError
from harness.yamlfile import load_yaml_model

Level = Literal["L1", "L2", "L3", "L4"]
LEVEL_RANK: dict[str, int] = {"L1": 1, "L2": 2, "L3": 3, "L4": 4}


class Strict(BaseModel):
    """Unknown keys in a policy file are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Permissions(Strict):
    """Where the Cedar permission policies live, relative to the policy file."""

    cedar: str


class Budgets(Strict):
    """Cost caps in USD against recorded cost (SPEC G1)."""

    per_run_usd: float | None = Field(default=None, gt=0)
    per_user_usd: float | None = Field(default=None, gt=0)
    per_tenant_usd: float | None = Field(default=None, gt=0)
    #: a model with no price in the price table: refuse it (at start, and any Run whose calls were recorded
    #: unpriced), or allow it with a warning in the policy trace (its calls then cost 0 USD, marked unpriced)
    unpriced_model: Literal["deny", "allow_with_warning"] = "deny"


class Guardrail(Strict):
    """Block or escalate a call when one of its arguments matches."""

    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    skill: str
    argument: str
    #: `shell_wipes`: the argument is a shell command that would delete one of the directories in
    #: `value` (a path or a list of absolute paths) or everything in it (harness.policy.shell)
    op: Literal["gt", "ge", "lt", "le", "eq", "ne", "matches", "contains", "shell_wipes"]
    value: Any
    verdict: Literal["reject", "escalate"]
    level: Level | None = None
    reason: str = ""

    @model_validator(mode="after")
    def _escalation_has_level(self) -> Guardrail:
        if self.verdict == "escalate" and self.level is None:
            raise ValueError(f"guardrail {self.id!r} escalates but names no level")
        if self.op == "shell_wipes":
            paths = [self.value] if isinstance(self.value, str) else self.value
            if not isinstance(paths, list) or not paths or not all(
                    isinstance(p, str) and p.startswith("/") for p in paths):
                raise ValueError(f"guardrail {self.id!r}: shell_wipes needs an absolute path or a list of them")
        if self.op == "matches":
            try:
                re.compile(str(self.value))  # as the rule is checked (harness.policy.guardrails)
            except re.error as exc:
                raise ValueError(f"guardrail {self.id!r}: {self.value!r} is not a valid regular expression: "
                                 f"{exc}") from None
        return self

    @property
    def protected(self) -> tuple[str, ...]:
        """The directories a shell_wipes rule protects."""
        return (self.value,) if isinstance(self.value, str) else tuple(self.value)


class Hitl(Strict):
    """Human approval settings (SPEC G2-G4)."""

    timeout_s: float = Field(default=86_400, gt=0)
    l3_timeout_action: Literal["escalate", "reject"] = "reject"
    approvers: dict[Level, list[str]] = Field(default_factory=dict)
    max_pending_per_requester: int = Field(default=20, ge=1)


class PolicyFile(Strict):
    """The whole policy file."""

    version: Literal[1]
    permissions: Permissions
    budgets: Budgets = Budgets()
    guardrails: list[Guardrail] = Field(default_factory=list)
    hitl: Hitl = Hitl()


def load_policy_file(path: Path) -> PolicyFile:
    """Read and validate a policy file; errors name the file and the field."""
    return load_yaml_model(path, PolicyFile, "the policy file", PolicyConfigError)
