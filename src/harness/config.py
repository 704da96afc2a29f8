"""Settings and the composition root: one place that wires ports to adapters (SPEC D1).

Every setting has an environment variable; the defaults are the embedded default — a SQLite file in
the working directory, the scripted LLM and the bundled support example's skills and policies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.adapters.llm.scripted import ScriptedProvider
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.store import SqlStore
from harness.errors import InvalidRequestError
from harness.examples.support import EXAMPLE_DIR
from harness.identity import IdentityDirectory
from harness.pipeline.context_assembler import ContextAssembler
from harness.pipeline.gatekeeper import PolicyEngine
from harness.pipeline.plan_orchestrator import PlanOrchestrator
from harness.pipeline.run_manager import RunManager
from harness.pipeline.tool_controller import ToolController
from harness.pipeline.trace_recorder import TraceRecorder
from harness.policy.hitl import HitlDesk
from harness.ports import Clock, LLMProvider, ResultSink
from harness.skills import SkillRegistry
from harness.state_machine import StateMachine


class Settings(BaseModel):
    """How a harness process is configured."""

    model_config = ConfigDict(extra="forbid")
    db: str | None = None
    skills_dirs: tuple[Path, ...] = (EXAMPLE_DIR / "skills",)
    policy_file: Path = EXAMPLE_DIR / "policy.yaml"
    llm: Literal["scripted"] = "scripted"
    llm_rules: Path = EXAMPLE_DIR / "llm_rules.yaml"
    identities_file: Path = EXAMPLE_DIR / "identities.yaml"
    data_dir: Path = Path("harness-data")
    execution_limit_s: float = Field(default=600.0, gt=0)

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from HARNESS_* environment variables, then explicit overrides."""
        env = os.environ
        values: dict[str, object] = {}
        if env.get("HARNESS_SKILLS_DIRS"):
            values["skills_dirs"] = tuple(Path(p) for p in env["HARNESS_SKILLS_DIRS"].split(os.pathsep) if p)
        for key, name in (("policy_file", "HARNESS_POLICY_FILE"), ("llm_rules", "HARNESS_LLM_RULES"),
                          ("data_dir", "HARNESS_DATA_DIR"), ("llm", "HARNESS_LLM"),
                          ("identities_file", "HARNESS_IDENTITIES"),
                          ("execution_limit_s", "HARNESS_EXECUTION_LIMIT_S")):
            if env.get(name):
                values[key] = env[name]
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValueError as exc:
            raise InvalidRequestError(f"invalid settings: {exc}") from exc


@dataclass
class Runtime:
    """Everything a process needs to run Runs, wired together."""

    settings: Settings
    store: SqlStore
    machine: StateMachine
    registry: SkillRegistry
    policy: PolicyEngine
    hitl: HitlDesk
    tools: ToolController
    recorder: TraceRecorder
    runs: RunManager
    identities: IdentityDirectory

    def close(self) -> None:
        """Release threads and connections."""
        self.tools.close()
        self.store.close()


def build_runtime(settings: Settings | None = None, *, clock: Clock | None = None,
                  provider: LLMProvider | None = None, sink: ResultSink | None = None,
                  store: SqlStore | None = None) -> Runtime:
    """Wire the ports to their adapters."""
    settings = settings or Settings.from_env()
    store = store or SqlStore.open(settings.db, clock)
    machine = StateMachine(store)
    registry = SkillRegistry.from_dirs(*settings.skills_dirs)
    ledger = CostLedger(store)
    policy = PolicyEngine.from_file(settings.policy_file, registry, ledger)
    hitl = HitlDesk(store, policy.policy.hitl)
    tools = ToolController(registry, workdir_root=settings.data_dir / "runs")
    provider = provider or ScriptedProvider.from_file(settings.llm_rules)
    runs = RunManager(
        store=store, machine=machine, assembler=ContextAssembler(), orchestrator=PlanOrchestrator(provider, registry),
        policy=policy, tools=tools, hitl=hitl, ledger=ledger, sink=sink, execution_limit_s=settings.execution_limit_s,
    )
    identities = IdentityDirectory.from_file(settings.identities_file)
    return Runtime(settings, store, machine, registry, policy, hitl, tools, TraceRecorder(store), runs, identities)
