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

from harness.adapters.llm.pricing import PricingTable
from harness.adapters.llm.resilient import GuardedProvider, ProviderSettings, make_provider
from harness.adapters.llm.scripted import ScriptedProvider
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.store import SqlStore
from harness.context.secrets import SecretFilter
from harness.context.tokenizer import tokenizer_for
from harness.errors import InvalidRequestError
from harness.examples.support import EXAMPLE_DIR
from harness.identity import IdentityDirectory
from harness.kernel import FINAL, RunState
from harness.memory.store import open_memory
from harness.memory.writeback import MemoryWriteBack
from harness.pipeline.context_assembler import ContextAssembler
from harness.pipeline.gatekeeper import PolicyEngine
from harness.pipeline.plan_orchestrator import PlanOrchestrator
from harness.pipeline.run_manager import RunManager
from harness.pipeline.tool_controller import ToolController
from harness.pipeline.trace_recorder import TraceRecorder
from harness.policy.hitl import HitlDesk
from harness.ports import Clock, LLMProvider, ResultSink, TraceBuffer
from harness.skills import SkillRegistry
from harness.state_machine import Listener, StateMachine


class Settings(BaseModel):
    """How a harness process is configured."""

    model_config = ConfigDict(extra="forbid")
    db: str | None = None
    skills_dirs: tuple[Path, ...] = (EXAMPLE_DIR / "skills",)
    policy_file: Path = EXAMPLE_DIR / "policy.yaml"
    llm: Literal["scripted", "openai", "anthropic"] = "scripted"
    llm_rules: Path = EXAMPLE_DIR / "llm_rules.yaml"
    # The real providers (openai, anthropic): model, optional fallback model, endpoint, the name of the
    # environment variable holding the key (the key itself never sits in settings), prices per model.
    llm_model: str | None = None
    llm_fallback_model: str | None = None
    llm_base_url: str | None = None
    llm_api_key_env: str | None = None
    llm_pricing: Path | None = None
    llm_stream: bool = False
    llm_plan_mode: Literal["json", "tool"] = "json"
    llm_timeout_s: float = Field(default=60.0, gt=0)
    identities_file: Path = EXAMPLE_DIR / "identities.yaml"
    data_dir: Path = Path("harness-data")
    execution_limit_s: float = Field(default=600.0, gt=0)
    sandbox: Literal["auto", "bwrap", "rlimit"] = "auto"
    #: Redis Streams between the outbox and the hash chain (SPEC D2), e.g. redis://127.0.0.1:6379/0;
    #: None drains the outbox straight into the chain
    trace_buffer: str | None = None
    #: context assembler (SPEC C1-C5): token encoding ("auto" follows the provider and model), memory
    #: recall mode, where a succeeded Run's summary is written back, the budget share memory may take
    tokenizer: Literal["auto", "cl100k_base", "o200k_base", "approx"] = "auto"
    memory: Literal["off", "lexical", "semantic"] = "lexical"
    memory_write_scope: Literal["user", "session"] = "user"
    memory_share: float = Field(default=0.25, ge=0.0, le=0.9)
    #: signed checkpoints published without a person (SPEC A3b) by `harness serve` and the Celery beat:
    #: every `checkpoint_interval_s` (0: never), into `checkpoint_dir` (None: ./harness-checkpoints/<database
    #: id>), each also given to the witnesses (directories or http(s) URLs)
    checkpoint_interval_s: float = Field(default=300.0, ge=0.0)
    checkpoint_dir: Path | None = None
    checkpoint_witnesses: tuple[str, ...] = ()

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
                          ("execution_limit_s", "HARNESS_EXECUTION_LIMIT_S"), ("sandbox", "HARNESS_SANDBOX"),
                          ("tokenizer", "HARNESS_TOKENIZER"), ("memory", "HARNESS_MEMORY"),
                          ("memory_write_scope", "HARNESS_MEMORY_WRITE_SCOPE"),
                          ("trace_buffer", "HARNESS_TRACE_BUFFER")):
            if env.get(name):
                values[key] = env[name]
        for key, name in (("checkpoint_interval_s", "HARNESS_CHECKPOINT_INTERVAL_S"),
                          ("checkpoint_dir", "HARNESS_CHECKPOINT_DIR")):
            if env.get(name):
                values[key] = env[name]
        if env.get("HARNESS_CHECKPOINT_WITNESS"):
            values["checkpoint_witnesses"] = tuple(w.strip() for w in env["HARNESS_CHECKPOINT_WITNESS"].split(",")
                                                   if w.strip())
        for key in ("llm_model", "llm_fallback_model", "llm_base_url", "llm_api_key_env", "llm_pricing",
                    "llm_stream", "llm_plan_mode", "llm_timeout_s"):
            if env.get(f"HARNESS_{key.upper()}"):
                values[key] = env[f"HARNESS_{key.upper()}"]
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


def _release_workdir(tools: ToolController) -> Listener:
    """A Run's private working directory lives until the Run is final (kept while it awaits a human)."""
    def listener(run_id: str, _source: RunState, target: RunState) -> None:
        if target in FINAL:
            tools.release(run_id)
    return listener


def llm_provider(settings: Settings, clock: Clock) -> LLMProvider:
    """The LLM provider the settings name; a real one retries itself (T3), with the SDK's retries off."""
    if settings.llm == "scripted":
        return ScriptedProvider.from_file(settings.llm_rules)
    key_env = settings.llm_api_key_env or f"{settings.llm.upper()}_API_KEY"
    api_key = os.environ.get(key_env)
    if not settings.llm_model or not api_key:
        raise InvalidRequestError(f"HARNESS_LLM={settings.llm} needs HARNESS_LLM_MODEL and an API key "
                                  f"in ${key_env}")
    pricing = PricingTable.from_file(settings.llm_pricing) if settings.llm_pricing else PricingTable()
    return make_provider(settings.llm, ProviderSettings(
        model=settings.llm_model, api_key=api_key, base_url=settings.llm_base_url,
        fallback_model=settings.llm_fallback_model, timeout_s=settings.llm_timeout_s,
        stream=settings.llm_stream, plan_mode=settings.llm_plan_mode, pricing=pricing), clock=clock)


def open_trace_buffer(url: str) -> TraceBuffer:
    """The trace buffer HARNESS_TRACE_BUFFER names (Redis Streams); it needs the `scale` extra."""
    try:
        from harness.adapters.redis_stream import RedisTraceBuffer
    except ImportError as exc:
        raise InvalidRequestError("HARNESS_TRACE_BUFFER needs the redis package: "
                                  "pip install 'harness-kernel[scale]'") from exc
    return RedisTraceBuffer.from_url(url)


def build_runtime(settings: Settings | None = None, *, clock: Clock | None = None,
                  provider: LLMProvider | None = None, sink: ResultSink | None = None,
                  store: SqlStore | None = None) -> Runtime:
    """Wire the ports to their adapters."""
    settings = settings or Settings.from_env()
    store = store or SqlStore.open(settings.db, clock)
    if settings.trace_buffer and store.trace_buffer is None:
        store.trace_buffer = open_trace_buffer(settings.trace_buffer)
    machine = StateMachine(store)
    registry = SkillRegistry.from_dirs(*settings.skills_dirs)
    ledger = CostLedger(store)
    policy = PolicyEngine.from_file(settings.policy_file, registry, ledger)
    hitl = HitlDesk(store, policy.policy.hitl)
    provider = provider or llm_provider(settings, store.clock)
    secret_filter = SecretFilter()
    tools = ToolController(registry, workdir_root=settings.data_dir / "runs", sandbox_mode=settings.sandbox,
                           clock=store.clock, provider=provider, record_cost=ledger.record,
                           scrub=lambda text: secret_filter.scrub(text).text)
    machine.subscribe(_release_workdir(tools))
    memory = open_memory(settings.memory, store.engine, store.clock, secret_filter)
    if memory is not None:
        machine.on_close(MemoryWriteBack(memory, settings.memory_write_scope))  # C5: SUCCEEDED only
    encoding = None if settings.tokenizer == "auto" else settings.tokenizer
    assembler = ContextAssembler(tokenizer_for(settings.llm, settings.llm_model, encoding), memory=memory,
                                 secret_filter=secret_filter, memory_share=settings.memory_share)
    runs = RunManager(
        store=store, machine=machine, assembler=assembler, orchestrator=PlanOrchestrator(
            provider, registry, max_attempts=1 if isinstance(provider, GuardedProvider) else 3),
        policy=policy, tools=tools, hitl=hitl, ledger=ledger, sink=sink, execution_limit_s=settings.execution_limit_s,
    )
    tools.child_runs = runs  # AgentInvoke creates child Runs through the same kernel (T4)
    identities = IdentityDirectory.from_file(settings.identities_file)
    return Runtime(settings, store, machine, registry, policy, hitl, tools, TraceRecorder(store), runs, identities)
