"""Agents: a name, instructions, a model, skills and a policy, defined in code or in a YAML file.

    name: support
    instructions: |
      You are the support agent of an online shop. ...
    model: gpt-4o-mini            # optional: the model of a real provider (HARNESS_LLM_MODEL otherwise)
    skills: [skills]              # folders of skill manifests, relative to this file
    policy: policy.yaml           # the policy file (it names its Cedar file)
    identities: identities.yaml   # optional: who is who
    llm_rules: llm_rules.yaml     # optional: the scripted model's rules (the offline default)
    max_rounds: 4                 # optional: rounds a Run may plan

The agent's instructions are the system prompt the context assembler builds on: they come first, then
how to answer with a plan (PLAN_FORMAT). In code, `skills` may also hold functions declared with
`@skill` (harness.code_skills). Settings a deployment gives explicitly (an environment variable, a
config file, an argument) win over the agent's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.code_skills import CodeSkill
from harness.domain.errors import BadInputError
from harness.examples.support import EXAMPLE_DIR
from harness.pipeline.context_assembler import PLAN_FORMAT, system_prompt_for
from harness.yamlfile import read_yaml

__all__ = ["PLAN_FORMAT", "Agent", "support_agent", "system_prompt"]

def system_prompt(instructions: str) -> str:
    """The system prompt for an agent with these instructions."""
    return system_prompt_for(instructions)


class Agent(BaseModel):
    """An agent: who it is (instructions), what it may do (skills, policy) and which model thinks."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
    instructions: str = Field(min_length=1, max_length=20_000)
    model: str | None = None
    skills: tuple[Path | CodeSkill, ...] = ()
    policy: Path | None = None
    identities: Path | None = None
    llm_rules: Path | None = None
    max_rounds: int | None = Field(default=None, ge=1, le=64)

    @classmethod
    def from_file(cls, path: str | Path) -> Agent:
        """An agent from its YAML file (paths relative to it); BadInputError names the file and field."""
        path = Path(path)
        raw = read_yaml(path, BadInputError, "the agent file")
        if not isinstance(raw, dict):
            raise BadInputError(f"{path}: an agent file is a mapping of fields (name, instructions, skills, ...)")
        base = path.resolve().parent
        values: dict[str, Any] = dict(raw)
        if isinstance(values.get("skills"), list):
            values["skills"] = [base / str(p) for p in values["skills"]]
        for key in ("policy", "identities", "llm_rules"):
            if isinstance(values.get(key), str):
                values[key] = base / values[key]
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(agent)"
            raise BadInputError(f"{path}: {where}: {err['msg']}") from None

    @property
    def system_prompt(self) -> str:
        """What the model is told first in every Run of this agent."""
        return system_prompt(self.instructions)

    @property
    def skill_dirs(self) -> tuple[Path, ...]:
        """The folders of YAML manifests among the skills."""
        return tuple(s for s in self.skills if isinstance(s, Path))

    @property
    def code_skills(self) -> tuple[CodeSkill, ...]:
        """The skills declared in code."""
        return tuple(s for s in self.skills if isinstance(s, CodeSkill))

    def settings_values(self) -> dict[str, Any]:
        """The settings this agent gives (a deployment's explicit settings win over them)."""
        values: dict[str, Any] = {"skills_dirs": self.skill_dirs}
        for key, value in (("policy_file", self.policy), ("identities_file", self.identities),
                           ("llm_rules", self.llm_rules), ("llm_model", self.model), ("max_rounds", self.max_rounds)):
            if value is not None:
                values[key] = value
        return values


def support_agent() -> Agent:
    """The bundled support example, as an agent."""
    return Agent.from_file(EXAMPLE_DIR / "agent.yaml")
