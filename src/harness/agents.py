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
    system_history: false         # optional: whether a caller's history may hold system messages
    knowledge_bases: [default]    # optional: the knowledge bases of the caller's tenant the agent may read

The agent's instructions are the system prompt the context assembler builds on: they come first, then
how to answer with a plan (PLAN_FORMAT). In code, `skills` may also hold functions declared with
`@skill` (harness.skills.decorated). Settings a deployment gives explicitly (an environment variable, a
config file, an argument) win over the agent's.

Every process (`harness serve`, `harness worker`, the CLI, `Harness`) finds its agent the same way,
`load_agent`: a reference is an agent file's path or `module:attr`, the attribute of an importable
module that holds an `Agent` (`HARNESS_AGENT=helpdesk_agent:helpdesk`, `--agent`), so an agent written
in Python is served, driven and approved by any process that imports it.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.domain.contracts import MAX_ROUNDS
from harness.domain.errors import BadInputError
from harness.examples.support import EXAMPLE_DIR
from harness.pipeline.context_assembler import system_prompt_for
from harness.settings import AGENT_REFERENCE
from harness.skills.decorated import CodeSkill
from harness.yamlfile import read_yaml

__all__ = ["Agent", "load_agent", "support_agent", "system_prompt"]

def system_prompt(instructions: str) -> str:
    """The system prompt for an agent with these instructions."""
    return system_prompt_for(instructions)


class Agent(BaseModel):
    """An agent: who it is (instructions), what it may do (skills, policy), what it may read (knowledge bases)
    and which model thinks."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
    instructions: str = Field(min_length=1, max_length=20_000)
    model: str | None = None
    skills: tuple[Path | CodeSkill, ...] = ()
    policy: Path | None = None
    identities: Path | None = None
    llm_rules: Path | None = None
    max_rounds: int | None = Field(default=None, ge=1, le=MAX_ROUNDS)
    #: whether a caller's `history` may hold messages with role system (by default they are refused: a
    #: caller speaking as the system would sit beside the agent's own instructions)
    system_history: bool = False
    #: the knowledge bases (of the Run's tenant) whose snippets the context may give the model; `harness kb add
    #: --kb NAME` fills one. Every agent reads the tenant's `default` one unless it names others.
    knowledge_bases: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")], ...] = ("default",)

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


def load_agent(reference: str | Path) -> Agent:
    """The agent a reference names: `module:attr` (an `Agent` held by an importable module; the working
    directory is importable, as for uvicorn and celery) or the path of an agent file. BadInputError names
    what is wrong: the module or attribute missing, the module failing to import, or no Agent there."""
    text = str(reference)
    match = None if isinstance(reference, Path) else AGENT_REFERENCE.match(text.strip())
    if match is None:
        return Agent.from_file(reference)
    module_name, attr = match["module"], match["attr"]
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise BadInputError(f"agent {text!r}: no module named {exc.name!r} (is it on PYTHONPATH, or in the "
                                "working directory?)") from None
        raise BadInputError(f"agent {text!r}: importing {module_name} failed: {exc}") from None
    except Exception as exc:
        raise BadInputError(f"agent {text!r}: importing {module_name} failed: {type(exc).__name__}: {exc}") from None
    value: object = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise BadInputError(f"agent {text!r}: module {module_name} has no attribute {attr!r}")
        value = getattr(value, part)
    if isinstance(value, type):
        raise BadInputError(f"agent {text!r}: {module_name}.{attr} is a class; name an Agent instance "
                            "(helpdesk = Agent(...) in the module, then module:helpdesk)")
    if not isinstance(value, Agent):
        raise BadInputError(f"agent {text!r}: {module_name}.{attr} is a {type(value).__name__}, not a "
                            "harness.Agent")
    return value
