"""Permission rules in Cedar, evaluated with cedarpy (SPEC G1, T2).

principal = User::"<tenant>/<user>" in each of its Role::"<role>"; action = Action::"call";
resource = Skill::"<id>" in SkillGroup::"<first segment of the id>"; context = risk and arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cedarpy

from harness.errors import PolicyConfigError
from harness.pipeline.contracts import CallerIdentity
from harness.skills import Skill


class CedarPermissions:
    """Answers "may this caller call this skill with these arguments?" from a pre-parsed policy set."""

    def __init__(self, policies: str, *, source: str = "<cedar>") -> None:
        try:
            self._policies = cedarpy.PolicySet.from_str(policies)
            probe = cedarpy.is_authorized(
                {"principal": 'User::"probe"', "action": 'Action::"call"', "resource": 'Skill::"probe"',
                 "context": {"risk": {"access": "read", "space": "project", "impact": "low"}, "arguments": {}}},
                self._policies, [])
        except Exception as exc:  # cedarpy raises plain exceptions for parse errors
            raise PolicyConfigError(f"{source}: Cedar policies do not parse: {exc}") from exc
        if probe.diagnostics.errors:
            raise PolicyConfigError(f"{source}: Cedar policies do not evaluate: {probe.diagnostics.errors}")
        self.source = source

    @classmethod
    def from_file(cls, path: Path) -> CedarPermissions:
        """Load Cedar policies from a file."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyConfigError(f"{path}: cannot read Cedar policies: {exc.strerror}") from exc
        return cls(text, source=str(path))

    def is_permitted(self, caller: CallerIdentity, skill: Skill, arguments: dict[str, Any]) -> tuple[bool, str]:
        """(allowed, explanation naming the policies that decided)."""
        principal = f"{caller.tenant_id}/{caller.user_id}"
        group = skill.id.split(".", 1)[0]
        entities: list[dict[str, Any]] = [
            {"uid": {"__entity": {"type": "User", "id": principal}}, "attrs": {"tenant": caller.tenant_id},
             "parents": [{"__entity": {"type": "Role", "id": r}} for r in caller.roles]},
            *({"uid": {"__entity": {"type": "Role", "id": r}}, "attrs": {}, "parents": []} for r in caller.roles),
            {"uid": {"__entity": {"type": "Skill", "id": skill.id}}, "attrs": {},
             "parents": [{"__entity": {"type": "SkillGroup", "id": group}}]},
            {"uid": {"__entity": {"type": "SkillGroup", "id": group}}, "attrs": {}, "parents": []},
        ]
        request = {
            "principal": {"type": "User", "id": principal},
            "action": {"type": "Action", "id": "call"},
            "resource": {"type": "Skill", "id": skill.id},
            "context": {"risk": skill.manifest.risk.model_dump(), "arguments": _cedar_safe(arguments)},
        }
        result = cedarpy.is_authorized(request, self._policies, entities)
        reasons = ", ".join(result.diagnostics.reasons) or "no permit matched"
        if result.diagnostics.errors:
            return False, f"policy evaluation error: {result.diagnostics.errors}"
        return result.allowed, reasons


def _cedar_safe(value: Any) -> Any:
    """Cedar has no floats or nulls: pass numbers as integers where exact, everything else as strings."""
    if isinstance(value, bool) or isinstance(value, int) or isinstance(value, str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else str(value)
    if isinstance(value, dict):
        return {str(k): _cedar_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_cedar_safe(v) for v in value if v is not None]
    return str(value)
