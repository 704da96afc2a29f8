"""Settings and the composition root: one place that wires ports to adapters (SPEC D1).

Every setting has an environment variable; the defaults are the embedded default — a SQLite file in
the working directory, the scripted LLM and the bundled support example's skills and policies.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.adapters.llm.factory import make_provider
from harness.adapters.llm.pricing import PricingTable
from harness.adapters.llm.resilient import GuardedProvider, ProviderSettings
from harness.adapters.llm.scripted import ScriptedProvider
from harness.adapters.sandbox import Workdirs, select_sandbox
from harness.adapters.sandbox.instance import HolderProcesses
from harness.adapters.sql import database
from harness.adapters.sql.audit_mirrors import check_archived_run
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.leases import Leases
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.memory import SqlMemoryRows
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.replay_reads import ReplayReads
from harness.adapters.sql.replay_reads import set_deadline as replay_set_deadline
from harness.adapters.sql.retention import RetentionStore
from harness.adapters.sql.run_queries import RunQueries
from harness.adapters.sql.run_writes import SqlRunWrites
from harness.adapters.sql.sandbox_instances import InstanceTable
from harness.adapters.sql.store import SqlStore, open_existing
from harness.adapters.sql.webhooks import WebhookOutbox
from harness.adapters.webhook_http import WebhookSender
from harness.agents import Agent, support_agent
from harness.context.secrets import SecretFilter
from harness.context.tokenizer import tokenizer_for
from harness.domain.audit import ChainReport
from harness.domain.contracts import MAX_CHAIN_DEPTH, RunResult
from harness.domain.errors import InvalidRequestError
from harness.domain.limits import RequestLimits
from harness.domain.retention import ArchivedRun
from harness.domain.sandbox import PoolSettings
from harness.examples.support import EXAMPLE_DIR
from harness.identity import IdentityDirectory
from harness.kernel import FINAL, RunState
from harness.kernel.thresholds import Thresholds, parse_overrides
from harness.leased_drive import LeasedDrive, default_owner
from harness.memory.store import open_memory
from harness.memory.writeback import MemoryWriteBack
from harness.paths import default_data_dir
from harness.pipeline.context_assembler import ContextAssembler
from harness.pipeline.gatekeeper import PolicyEngine
from harness.pipeline.plan_orchestrator import PlanOrchestrator
from harness.pipeline.run_manager import RunManager
from harness.pipeline.sandbox_pool import SandboxPool
from harness.pipeline.tool_controller import Executor, ToolController
from harness.pipeline.trace_recorder import TraceRecorder
from harness.policy.hitl import HitlDesk
from harness.ports import Clock, LLMProvider, ResultSink, TraceBuffer
from harness.ports.audit import AuditReads, ReconcileReads
from harness.ports.leases import RunLeases
from harness.ports.ledger import CostBook
from harness.ports.queries import ReadModel
from harness.ports.sandboxes import SandboxInstances
from harness.skills import SkillRegistry
from harness.state_machine import Listener, StateMachine
from harness.webhooks.config import WebhookConfig, load_webhook_config
from harness.webhooks.delivery import WebhookDispatcher
from harness.webhooks.notifier import PushEvents, WebhookNotifier, WebhookResultSink
from harness.yamlfile import read_yaml

if TYPE_CHECKING:
    from harness.mcp_skills import McpServers


#: the model name and endpoint of HARNESS_LLM=local when HARNESS_LLM_MODEL / HARNESS_LLM_BASE_URL say nothing
LOCAL_MODEL = "smollm2-135m-instruct"
LOCAL_URL = "http://127.0.0.1:8080/v1"


class Settings(BaseModel):
    """How a harness process is configured."""

    model_config = ConfigDict(extra="forbid")
    db: str | None = None
    #: the agent file (YAML: name, instructions, model, skills, policy); None: the bundled support agent,
    #: unless skills, policy, rules or identities are set one by one
    agent: Path | None = None
    skills_dirs: tuple[Path, ...] = (EXAMPLE_DIR / "skills",)
    #: installed packages whose modules may be skill entrypoints (besides files in a skill's folder)
    skill_packages: tuple[str, ...] = ()
    policy_file: Path = EXAMPLE_DIR / "policy.yaml"
    #: "local": an OpenAI-compatible server of a model on this machine (llama-cpp-python's, see
    #: docs/local-model.md), at llm_base_url (default http://127.0.0.1:8080/v1), needing no API key
    llm: Literal["scripted", "openai", "anthropic", "local"] = "scripted"
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
    #: how the plan is asked for (None: json_schema for openai, json_object with a schema for local), whether
    #: the skills are described in the system prompt instead of sent as tools (None: only for local), and
    #: the most tokens an answer may take (None: 512 for local, else as the context budget allows)
    llm_plan_format: Literal["json_schema", "json_object", "none"] | None = None
    llm_tools_in_prompt: bool | None = None
    llm_max_tokens: int | None = Field(default=None, gt=0)
    #: the most steps the plan's schema admits (None: 1 for local, a small model repeats steps; else 8)
    llm_plan_max_steps: int | None = Field(default=None, ge=1, le=64)
    identities_file: Path = EXAMPLE_DIR / "identities.yaml"
    #: Runs' working directories and the bundled example's ledger (HARNESS_DATA_DIR)
    data_dir: Path = Field(default_factory=default_data_dir)
    execution_limit_s: float = Field(default=600.0, gt=0)
    #: how many levels of child Runs (AgentInvoke) a Run may start when its caller gives no
    #: chain_remaining, and the most a caller may give
    chain_depth: int = Field(default=4, ge=0, le=MAX_CHAIN_DEPTH)
    #: how many rounds a Run may plan (each round's results are shown to the model before the next)
    max_rounds: int = Field(default=4, ge=1, le=64)
    sandbox: Literal["auto", "bwrap", "rlimit"] = "auto"
    #: sandboxes as a scarce resource: this host's name (instances, caps and the port pool are per host),
    #: how many instances may live at once on it and per tenant, its port range ("41000-41255"; "" for
    #: none), and how long an instance's lease lives without this host renewing it
    sandbox_host: str = Field(default_factory=socket.gethostname, min_length=1, max_length=100)
    sandbox_host_cap: int = Field(default=32, ge=1, le=10_000)
    sandbox_tenant_cap: int = Field(default=16, ge=1, le=10_000)
    sandbox_ports: str = "41000-41255"
    sandbox_lease_s: float = Field(default=300.0, gt=0)

    @field_validator("sandbox_ports")
    @classmethod
    def _port_range(cls, value: str) -> str:
        parse_port_range(value)
        return value

    def pool_settings(self) -> PoolSettings:
        """The sandbox pool these settings describe."""
        return PoolSettings(host=self.sandbox_host, host_cap=self.sandbox_host_cap,
                            tenant_cap=self.sandbox_tenant_cap, port_range=parse_port_range(self.sandbox_ports),
                            lease_s=self.sandbox_lease_s)
    #: Redis Streams between the outbox and the hash chain (SPEC D2), e.g. redis://127.0.0.1:6379/0;
    #: None drains the outbox straight into the chain
    trace_buffer: str | None = None
    #: context assembler (SPEC C1-C5): token encoding ("auto" follows the provider and model), memory
    #: recall mode, where a succeeded Run's summary is written back, the budget share memory may take
    tokenizer: Literal["auto", "cl100k_base", "o200k_base", "approx"] = "auto"
    memory: Literal["off", "lexical", "semantic"] = "lexical"
    memory_write_scope: Literal["user", "session"] = "user"
    memory_share: float = Field(default=0.25, ge=0.0, le=0.9)
    #: leases (one driver per Run): how long a driver's lease lives without a heartbeat (it heartbeats
    #: every third of it), and how many times a Run's lease may be taken over from a dead driver before
    #: the Run is failed as poison instead of resumed again
    lease_ttl_s: float = Field(default=30.0, gt=0)
    max_stalls: int = Field(default=3, ge=1)
    #: the sweeper: how often it passes, per-state thresholds in seconds overriding the defaults (by state
    #: name; EXECUTING's default follows execution_limit_s), the heartbeat ceiling as a multiple of a
    #: state's threshold, and how long a decided approval may wait for its Run to move
    sweep_interval_s: float = Field(default=30.0, gt=0)
    state_thresholds: dict[str, float] = Field(default_factory=dict)
    heartbeat_ceiling_factor: float = Field(default=2.0, ge=1.0)
    decided_approval_s: float = Field(default=30.0, gt=0)
    #: a Run nobody drives is picked up by the embedded worker once it has not moved for this long
    redrive_grace_s: float = Field(default=2.0, ge=0)

    def thresholds(self) -> Thresholds:
        """The sweeper's thresholds these settings describe."""
        try:
            return Thresholds.build(self.state_thresholds, execution_limit_s=self.execution_limit_s,
                                    ceiling_factor=self.heartbeat_ceiling_factor, decided_s=self.decided_approval_s)
        except ValueError as exc:
            raise InvalidRequestError(f"invalid settings: state_thresholds: {exc}") from exc
    #: how large a Run request may be (HARNESS_MAX_* variables, harness.domain.limits)
    limits: RequestLimits = RequestLimits()
    #: approver endpoints, Caller signing secrets and the retry schedule of the pushed events (SPEC P4 /
    #: N1); None: only HARNESS_WEBHOOK_SECRET, if set, signing every tenant's callbacks
    webhooks_file: Path | None = None
    #: signed checkpoints published without a person (SPEC A3b) by `harness serve` and the Celery beat:
    #: every `checkpoint_interval_s` (0: never), into `checkpoint_dir` (None: ./harness-checkpoints/<database
    #: id>), each also given to the witnesses (directories or http(s) URLs)
    checkpoint_interval_s: float = Field(default=300.0, ge=0.0)
    checkpoint_dir: Path | None = None
    checkpoint_witnesses: tuple[str, ...] = ()
    #: MCP servers whose tools are skills (HARNESS_MCP_FILE, harness.mcp_skills); None: no MCP server
    mcp_file: Path | None = None

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from the file HARNESS_CONFIG_FILE names (YAML, keys as the fields here), then
        HARNESS_* environment variables, then explicit overrides."""
        env = os.environ
        values: dict[str, object] = _config_file(env.get("HARNESS_CONFIG_FILE"))
        if env.get("HARNESS_SKILLS_DIRS"):
            values["skills_dirs"] = tuple(Path(p) for p in env["HARNESS_SKILLS_DIRS"].split(os.pathsep) if p)
        if env.get("HARNESS_SKILL_PACKAGES"):
            values["skill_packages"] = tuple(p.strip() for p in env["HARNESS_SKILL_PACKAGES"].split(",") if p.strip())
        for key, name in (("policy_file", "HARNESS_POLICY_FILE"), ("llm_rules", "HARNESS_LLM_RULES"),
                          ("data_dir", "HARNESS_DATA_DIR"), ("llm", "HARNESS_LLM"),
                          ("identities_file", "HARNESS_IDENTITIES"),
                          ("execution_limit_s", "HARNESS_EXECUTION_LIMIT_S"), ("sandbox", "HARNESS_SANDBOX"),
                          ("chain_depth", "HARNESS_CHAIN_DEPTH"), ("max_rounds", "HARNESS_MAX_ROUNDS"),
                          ("tokenizer", "HARNESS_TOKENIZER"), ("memory", "HARNESS_MEMORY"),
                          ("memory_write_scope", "HARNESS_MEMORY_WRITE_SCOPE"),
                          ("trace_buffer", "HARNESS_TRACE_BUFFER"),
                          ("webhooks_file", "HARNESS_WEBHOOKS_FILE"), ("agent", "HARNESS_AGENT"),
                          ("mcp_file", "HARNESS_MCP_FILE")):
            if env.get(name):
                values[key] = env[name]
        for key, name in (("checkpoint_interval_s", "HARNESS_CHECKPOINT_INTERVAL_S"),
                          ("checkpoint_dir", "HARNESS_CHECKPOINT_DIR")):
            if env.get(name):
                values[key] = env[name]
        if env.get("HARNESS_CHECKPOINT_WITNESS"):
            values["checkpoint_witnesses"] = tuple(w.strip() for w in env["HARNESS_CHECKPOINT_WITNESS"].split(",")
                                                   if w.strip())
        for key in ("sandbox_host", "sandbox_host_cap", "sandbox_tenant_cap", "sandbox_lease_s"):
            if env.get(f"HARNESS_{key.upper()}"):
                values[key] = env[f"HARNESS_{key.upper()}"]
        if "HARNESS_SANDBOX_PORTS" in env:
            values["sandbox_ports"] = env["HARNESS_SANDBOX_PORTS"]
        for key in ("llm_model", "llm_fallback_model", "llm_base_url", "llm_api_key_env", "llm_pricing",
                    "llm_stream", "llm_plan_mode", "llm_timeout_s", "llm_plan_format", "llm_tools_in_prompt",
                    "llm_max_tokens", "llm_plan_max_steps", "lease_ttl_s", "max_stalls", "sweep_interval_s",
                    "heartbeat_ceiling_factor", "decided_approval_s", "redrive_grace_s"):
            if env.get(f"HARNESS_{key.upper()}"):
                values[key] = env[f"HARNESS_{key.upper()}"]
        if env.get("HARNESS_STATE_THRESHOLDS"):
            try:
                values["state_thresholds"] = parse_overrides(env["HARNESS_STATE_THRESHOLDS"])
            except ValueError as exc:
                raise InvalidRequestError(f"invalid settings: HARNESS_STATE_THRESHOLDS: {exc}") from exc
        values["limits"] = RequestLimits.from_env()
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            settings = cls.model_validate(values)
        except ValueError as exc:
            raise InvalidRequestError(f"invalid settings: {exc}") from exc
        settings.thresholds()  # a bad threshold is named now, not at the first sweep
        return settings


def parse_port_range(text: str) -> tuple[int, int] | None:
    """"LOW-HIGH" (inclusive, within 1024-65535) as a pair; "" for no port pool."""
    if not text.strip():
        return None
    low, sep, high = text.strip().partition("-")
    try:
        pair = (int(low), int(high if sep else low))
    except ValueError:
        raise ValueError(f"sandbox_ports must be LOW-HIGH, like 41000-41255, not {text!r}") from None
    if not 1024 <= pair[0] <= pair[1] <= 65535:
        raise ValueError(f"sandbox_ports {text!r}: the range must lie within 1024-65535, low before high")
    return pair


#: fields of Settings that are paths: in a config file they are relative to the file's folder
_PATH_FIELDS = ("skills_dirs", "policy_file", "llm_rules", "llm_pricing", "identities_file", "data_dir", "agent",
                "mcp_file")


def _config_file(name: str | None) -> dict[str, object]:
    """The settings a YAML config file holds (HARNESS_CONFIG_FILE); {} when none is named."""
    if not name:
        return {}
    path = Path(name)
    raw = read_yaml(path, InvalidRequestError, "the config file")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRequestError(f"{path}: the config file must be a mapping of setting names to values")
    values: dict[str, object] = dict(raw)
    base = path.resolve().parent
    for key in _PATH_FIELDS:
        value = values.get(key)
        if isinstance(value, str):
            values[key] = str(base / value)
        elif isinstance(value, list):
            values[key] = [str(base / str(v)) for v in value]
    return values


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
    webhooks: WebhookConfig | None = None
    webhook_outbox: WebhookOutbox | None = None
    agent: Agent | None = None
    mcp: McpServers | None = None

    @property
    def reads(self) -> ReadModel:
        """The read model over this runtime's store (listings, the change feed, counts)."""
        return read_model(self.store)

    def dispatcher(self) -> WebhookDispatcher:
        """A delivery loop for this runtime's webhook outbox (the caller closes it)."""
        assert self.webhooks is not None and self.webhook_outbox is not None
        return WebhookDispatcher(self.webhook_outbox, self.webhooks, WebhookSender(self.webhooks.delivery.timeout_s))

    def close(self) -> None:
        """Release threads and connections."""
        self.runs.children.close()
        self.tools.close()
        if self.mcp is not None:
            self.mcp.close()  # stdio servers are stopped, not orphaned
        self.store.close()


#: what the store raises when its database fails (the shells answer 503 or exit 2), and whether a failure is
#: an outage (down, locked, read-only: a retry later may succeed) rather than a bug
DatabaseError = database.DatabaseError
is_outage = database.is_outage


def cost_ledger(store: SqlStore) -> CostLedger:
    """The cost ledger over a store (spend by Run, tenant, user, skill, day)."""
    return CostLedger(store)


def webhook_outbox(store: SqlStore) -> WebhookOutbox:
    """The webhook deliveries waiting, done and dead, over a store."""
    return WebhookOutbox(store)


def sandbox_instances(store: SqlStore) -> SandboxInstances:
    """The sandbox instances of every host, over a store."""
    return InstanceTable(store)


def sandbox_pool(store: SqlStore, pool: PoolSettings, *, owner: str, ledger: CostBook | None = None,
                 price_per_s: float = 0.0, price_table: str | None = None) -> SandboxPool:
    """This host's sandbox pool over a store's instance table, with the processes of this host; a kept
    instance's seconds are booked to `ledger` (none: not booked)."""
    return SandboxPool(InstanceTable(store), HolderProcesses(), pool, owner=owner, ledger=ledger,
                       price_per_s=price_per_s, price_table=price_table)


#: the store the composition root opens: shells name it in signatures where they hand a store on to code
#: typed against it, and never build one themselves
Store = SqlStore


def archived_rows_check(line: Mapping[str, Any], report: ChainReport) -> None:
    """Check an archived Run's rows, as its segment line holds them, against its records (what a
    read-back shows is proven only through them): the row-mirror check of `harness audit verify`."""
    check_archived_run(line, report)


def archived_run(store: SqlStore, run_id: str) -> ArchivedRun | None:
    """Where an archived Run is (segment, location, checkpoint), when it was archived."""
    return RetentionStore(store).archived(run_id)


def replay_reads(store: SqlStore) -> ReplayReads:
    """What a replay reads of a recorded Run beyond the store's reads (outbox, blobs, decisions, history)."""
    return ReplayReads(store)


def set_deadline(store: SqlStore, run_id: str, deadline_at: float) -> None:
    """Give a replayed Run the deadline its recorded original had."""
    replay_set_deadline(store, run_id, deadline_at)


def open_store(db: str | None = None, clock: Clock | None = None, *, migrate_schema: bool = True) -> SqlStore:
    """The store named by `db` (a database URL or SQLite file path), HARNESS_DATABASE_URL or the default;
    created and migrated on first use unless `migrate_schema` is false."""
    return SqlStore.open(db, clock, migrate_schema=migrate_schema)


def open_existing_store(db: str | None) -> SqlStore:
    """The store named by `db`, refusing to create a new SQLite file (InvalidRequestError)."""
    return open_existing(db)


def webhook_sender(timeout_s: float) -> WebhookSender:
    """A signed HTTP sender of webhook events (the caller closes it)."""
    return WebhookSender(timeout_s)


def read_model(store: SqlStore) -> ReadModel:
    """The read model (listings, the change feed, counts) over a store."""
    return RunQueries(store)


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
    local = settings.llm == "local"
    key_env = settings.llm_api_key_env or f"{settings.llm.upper()}_API_KEY"
    api_key = "local" if local else os.environ.get(key_env)  # a server on this machine needs no key
    model = settings.llm_model or (LOCAL_MODEL if local else None)
    if not model or not api_key:
        raise InvalidRequestError(f"HARNESS_LLM={settings.llm} needs HARNESS_LLM_MODEL and an API key "
                                  f"in ${key_env}")
    return make_provider("openai" if local else settings.llm, ProviderSettings(
        model=model, api_key=api_key, base_url=settings.llm_base_url or (LOCAL_URL if local else None),
        fallback_model=settings.llm_fallback_model, timeout_s=settings.llm_timeout_s,
        stream=settings.llm_stream, plan_mode=settings.llm_plan_mode,
        pricing=PricingTable.for_deployment(settings.llm_pricing),
        plan_format=settings.llm_plan_format or ("json_object" if local else "json_schema"),
        tools_in_prompt=local if settings.llm_tools_in_prompt is None else settings.llm_tools_in_prompt,
        max_output_tokens=settings.llm_max_tokens or (512 if local else None),
        plan_max_steps=settings.llm_plan_max_steps or (1 if local else 8)), clock=clock)


def check_priced(settings: Settings, pricing: PricingTable, unpriced: str) -> None:
    """Refuse, when the policy denies unpriced models, a real provider whose model or fallback model has no
    price: every call would count 0 USD and no budget would ever bite."""
    if settings.llm == "scripted" or unpriced != "deny":
        return
    named = settings.llm_model or (LOCAL_MODEL if settings.llm == "local" else None)
    for model in (named, settings.llm_fallback_model):
        if model and pricing.price_of(model) is None:
            raise InvalidRequestError(
                f"the model {model!r} has no price in the price table (dated {pricing.as_of}); add it to the "
                "file HARNESS_LLM_PRICING names, or set budgets.unpriced_model: allow_with_warning in the policy")


def open_mcp(settings: Settings, registry: SkillRegistry) -> McpServers | None:
    """The MCP servers HARNESS_MCP_FILE names (they start at first use); they need the `mcp` extra."""
    if settings.mcp_file is None:
        return None
    try:
        from harness.mcp_skills import McpServers, load_mcp_file
    except ImportError as exc:
        raise InvalidRequestError("HARNESS_MCP_FILE needs the mcp package: pip install 'harness-kernel[mcp]'") from exc
    groups = {skill.id.split(".", 1)[0] for skill in registry.all()}
    return McpServers(load_mcp_file(settings.mcp_file), config_path=settings.mcp_file, reserved_groups=sorted(groups))


def mcp_kinds(mcp: McpServers | None, ledger: CostLedger, store: SqlStore) -> dict[str, Executor]:
    """The tool controller's executor of MCP tools: costs to the ledger, server restarts to the Run's audit."""
    if mcp is None:
        return {}
    from harness.mcp_skills import McpCalls

    def audit(run_id: str | None, event: str, detail: dict[str, object]) -> None:
        store.audit(run_id, event, "tool_controller", dict(detail))
    mcp.audit = audit
    return {"mcp": McpCalls(mcp, ledger.record)}


def audit_reads(store: SqlStore) -> AuditReads:
    """The audit's read port over a store: what the verifier, checkpoints and exports read."""
    return SqlAuditReads(store)


def reconcile_reads(store: SqlStore) -> ReconcileReads:
    """What `harness audit reconcile` reads, over a store."""
    return SqlReconcileReads(store)


def open_trace_buffer(url: str) -> TraceBuffer:
    """The trace buffer HARNESS_TRACE_BUFFER names (Redis Streams); it needs the `scale` extra."""
    try:
        from harness.adapters.redis_stream import RedisTraceBuffer
    except ImportError as exc:
        raise InvalidRequestError("HARNESS_TRACE_BUFFER needs the redis package: "
                                  "pip install 'harness-kernel[scale]'") from exc
    return RedisTraceBuffer.from_url(url)


#: settings that, given one by one, mean the deployment assembles its own agent rather than the bundled one
_AGENT_FIELDS = frozenset({"skills_dirs", "policy_file", "llm_rules", "identities_file"})


def resolve_agent(settings: Settings, agent: Agent | None = None) -> tuple[Settings, Agent | None]:
    """The agent a process runs (given, named by the settings, or the bundled support agent when the
    settings assemble none) and the settings with the agent's values under the explicit ones."""
    if agent is None and settings.agent is not None:
        agent = Agent.from_file(settings.agent)
    if agent is None and not settings.model_fields_set & _AGENT_FIELDS:
        agent = support_agent()
    if agent is None:
        return settings, None
    values = {k: v for k, v in agent.settings_values().items() if k not in settings.model_fields_set}
    resolved = settings.model_copy(update=values)
    # the agent's values are not the deployment's choices: settings rebuilt from these (a replay's) find the
    # same agent again
    object.__setattr__(resolved, "__pydantic_fields_set__", set(settings.model_fields_set))
    return resolved, agent


def open_leases(runtime: Runtime, ttl_s: float) -> RunLeases:
    """The leases of the runtime's Runs, living `ttl_s` without a heartbeat."""
    return Leases(runtime.store, ttl_s=ttl_s)


def build_runtime(settings: Settings | None = None, *, clock: Clock | None = None,
                  provider: LLMProvider | None = None, sink: ResultSink | None = None,
                  store: SqlStore | None = None, agent: Agent | None = None) -> Runtime:
    """Wire the ports to their adapters, for `agent` (or the one the settings name)."""
    settings, agent = resolve_agent(settings or Settings.from_env(), agent)
    store = store or SqlStore.open(settings.db, clock)
    if settings.trace_buffer and store.trace_buffer is None:
        store.trace_buffer = open_trace_buffer(settings.trace_buffer)
    machine = StateMachine(store)
    registry = SkillRegistry.from_dirs(*settings.skills_dirs, packages=settings.skill_packages)
    if agent is not None and agent.code_skills:
        registry = SkillRegistry([*registry.all(), *(s.skill for s in agent.code_skills)])
    mcp = open_mcp(settings, registry)
    if mcp is not None:
        registry = SkillRegistry(registry.all(), sources=(mcp,))
    ledger = CostLedger(store)
    policy = PolicyEngine.from_file(settings.policy_file, registry, ledger)
    hitl = HitlDesk(store, policy.policy.hitl)
    pricing = PricingTable.for_deployment(settings.llm_pricing)
    if provider is None:
        check_priced(settings, pricing, policy.policy.budgets.unpriced_model)
    provider = provider or llm_provider(settings, store.clock)
    secret_filter = SecretFilter()
    sandboxes = sandbox_pool(store, settings.pool_settings(), owner=f"{settings.sandbox_host}:{os.getpid()}",
                             ledger=ledger, price_per_s=pricing.sandbox_price, price_table=pricing.as_of)
    tools = ToolController(registry, workdirs=Workdirs(settings.data_dir / "runs"), data_dir=settings.data_dir,
                           choose_sandbox=lambda: select_sandbox(settings.sandbox),
                           clock=store.clock, provider=provider, record_cost=ledger.record,
                           scrub=lambda text: secret_filter.scrub(text).text, sandbox_price=pricing.sandbox_price,
                           price_table=pricing.as_of, sandbox_pool=sandboxes, kinds=mcp_kinds(mcp, ledger, store))
    machine.in_transaction(sandboxes.on_transition)  # instances end (and are billed) as their Run closes
    machine.subscribe(sandboxes.after_change)  # then their processes are stopped
    machine.cost_total = lambda run: ledger.run_total(run.run_id).to_dict()  # A1: child Runs included
    machine.subscribe(_release_workdir(tools))
    memory = open_memory(settings.memory, SqlMemoryRows(store.engine), store.clock, secret_filter)
    if memory is not None:
        machine.on_close(MemoryWriteBack(memory, settings.memory_write_scope))  # C5: SUCCEEDED only
    identities = IdentityDirectory.from_file(settings.identities_file)
    encoding = None if settings.tokenizer == "auto" else settings.tokenizer
    assembler = ContextAssembler(tokenizer_for(settings.llm, settings.llm_model, encoding), memory=memory,
                                 secret_filter=secret_filter, memory_share=settings.memory_share,
                                 instructions=agent.instructions if agent is not None else None)
    webhooks = load_webhook_config(settings.webhooks_file)
    outbox = WebhookOutbox(store)
    notifier = WebhookNotifier(outbox, webhooks)
    pushes = PushEvents(notifier, sink or WebhookResultSink(notifier))
    machine.in_transaction(pushes.on_transition)  # results of every close and park (P4), in its transaction
    hitl.on_insert(pushes.on_request)  # approval requests opened or escalated (N1), in their transaction
    runs = RunManager(
        store=store, writes=SqlRunWrites(store, ledger), machine=machine, assembler=assembler,
        orchestrator=PlanOrchestrator(
            provider, registry, max_attempts=1 if isinstance(provider, GuardedProvider) else 3),
        policy=policy, tools=tools, hitl=hitl, ledger=ledger, execution_limit_s=settings.execution_limit_s,
        chain_depth=settings.chain_depth, max_rounds=settings.max_rounds, limits=settings.limits,
        roles_of=identities.roles_of,
        check_callback=lambda request: webhooks.check_callback(request.tenant_id, request.callback or ""),
        child_leases=Leases(store, ttl_s=60.0),
    )
    tools.child_runs = runs  # AgentInvoke creates child Runs through the same kernel (T4)
    runtime = Runtime(settings, store, machine, registry, policy, hitl, tools, TraceRecorder(store), runs, identities,
                      webhooks, outbox, agent, mcp)

    # every drive holds the Run's lease (K5b, T6), as the thread that drives it (owner host:pid:thread)
    def drive(run_id: str) -> RunResult | None:
        return LeasedDrive(store, runs, machine, open_leases(runtime, settings.lease_ttl_s), owner=default_owner(),
                           max_stalls=settings.max_stalls).execute(run_id)
    runs.driver = drive
    runs.children.leased_drive = runs.driver
    return runtime
