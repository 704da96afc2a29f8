"""Permission rules in Cedar, evaluated with cedarpy (SPEC G1, T2).

principal = User::"<tenant>/<user>" in each of its Role::"<role>"; action = Action::"call";
resource = Skill::"<id>" in SkillGroup::"<first segment of the id>"; context = risk and arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cedarpy

from harness.domain.chain import text_hash
from harness.domain.contracts import CallerIdentity
from harness.domain.errors import PolicyConfigError
from harness.skills.manifests import Skill
from harness.yamlfile import read_text


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
        #: the hash of the policy text, part of the rule set's hash a PolicyTrace names
        self.text_hash = text_hash(policies)

    @classmethod
    def from_file(cls, path: Path) -> CedarPermissions:
        """Load Cedar policies from a file."""
        return cls(read_text(path, PolicyConfigError, "Cedar policies"), source=str(path))

    def is_permitted(self, caller: CallerIdentity, skill: Skill, arguments: dict[str, Any]) -> tuple[bool, str]:
        """(allowed, explanation naming the policies that decided)."""
        return self.are_permitted(caller, [(skill, arguments)])[0]

    def are_permitted(self, caller: CallerIdentity,
                      calls: Sequence[tuple[Skill, dict[str, Any]]]) -> list[tuple[bool, str]]:
        """`is_permitted` for each (skill, arguments) of one caller, in one evaluation of the policy set
        (a plan's calls share the entity graph: one parse of it instead of one per call)."""
        if not calls:
            return []
        principal = f"{caller.tenant_id}/{caller.user_id}"
        entities: dict[tuple[str, str], dict[str, Any]] = {}

        def entity(kind: str, name: str, attrs: dict[str, Any], parents: list[tuple[str, str]]) -> None:
            entities[(kind, name)] = {"uid": {"__entity": {"type": kind, "id": name}}, "attrs": attrs,
                                      "parents": [{"__entity": {"type": k, "id": n}} for k, n in parents]}

        entity("User", principal, {"tenant": caller.tenant_id}, [("Role", r) for r in caller.roles])
        for role in caller.roles:
            entity("Role", role, {}, [])
        requests = []
        for skill, arguments in calls:
            group = skill.id.split(".", 1)[0]
            entity("Skill", skill.id, {}, [("SkillGroup", group)])
            entity("SkillGroup", group, {}, [])
            requests.append({
                "principal": {"type": "User", "id": principal},
                "action": {"type": "Action", "id": "call"},
                "resource": {"type": "Skill", "id": skill.id},
                "context": {"risk": skill.manifest.risk.model_dump(), "arguments": _cedar_safe(arguments)},
            })
        answers = []
        for result in cedarpy.is_authorized_batch(requests, self._policies, list(entities.values())):
            if result.diagnostics.errors:
                answers.append((False, f"policy evaluation error: {result.diagnostics.errors}"))
            else:
                answers.append((result.allowed, ", ".join(result.diagnostics.reasons) or "no permit matched"))
        return answers


def _cedar_safe(value: Any) -> Any:
    """Cedar has no floats or nulls: pass numbers as integers where exact, everything else as strings."""
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else str(value)
    if isinstance(value, dict):
        return {str(k): _cedar_safe(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_cedar_safe(v) for v in value if v is not None]
    return str(value)
