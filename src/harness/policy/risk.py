"""Risk routing of tool calls to approval levels (SPEC G2)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from harness.policy.config import LEVEL_RANK, Level


class Risk(BaseModel):
    """What a call can do: read or write, in which resource space, with what impact (SPEC G2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    access: Literal["read", "write"]
    space: Literal["personal", "project", "production"] = "project"
    impact: Literal["low", "medium", "high"] = "low"


_PERSONAL: dict[str, Level] = {"low": "L1", "medium": "L2", "high": "L3"}


def level_for(risk: Risk) -> Level:
    """Read-only → L1; writes by resource space: personal by impact, project L2, production L4."""
    if risk.access == "read":
        return "L1"
    if risk.space == "personal":
        return _PERSONAL[risk.impact]
    if risk.space == "project":
        return "L2"
    return "L4"


def highest(levels: list[Level]) -> Level:
    """The plan's highest level decides the wait (SPEC G3)."""
    return max(levels, key=LEVEL_RANK.__getitem__, default="L1")
