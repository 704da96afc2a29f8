"""The composition root: one place that wires ports to adapters (SPEC D1).

`build_runtime` builds a Runtime from Settings (harness.settings), with
what a Runtime needs besides the pipeline (the agent it runs, its MCP servers, knowledge bases and change
feed). The factories of one family of ports each are in harness.wiring (the model, the sandbox, archive and
erasure, the checkpoint signer); the store and the views over it in harness.stores.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.adapters.change_feed import LocalChangeFeed
from harness.adapters.llm.pricing import PricingTable
from harness.adapters.llm.resilient import GuardedProvider
from harness.adapters.sandbox.workdirs import Workdirs
from harness.adapters.sql.approvals import SqlApprovals
from harness.adapters.sql.knowledge import SqlKnowledgeRows
from harness.adapters.sql.leases import Leases
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.memory import SqlMemoryRows
from harness.adapters.sql.pg_listen import PgChangeFeed, listens
from harness.adapters.sql.run_writes import SqlRunWrites
from harness.adapters.sql.store import SqlStore
from harness.adapters.sql.webhooks import WebhookOutbox
from harness.agents import Agent, load_agent, support_agent
from harness.context.secrets import SecretFilter
from harness.context.tokenizer import tokenizer_for
from harness.domain.contracts import RunResult
from harness.domain.errors import InvalidRequestError
from harness.drive.leased import LeasedDrive, default_owner
from harness.drive.state_machine import Listener, StateMachine
from harness.kernel.states import FINAL, RunState
from harness.knowledge.base import DEFAULT_KB, KnowledgeBase, open_knowledge
from harness.memory.store import open_memory
from harness.memory.writeback import MemoryWriteBack
from harness.pipeline.artifacts import ArtifactLimits
from harness.pipeline.context_assembler import ContextAssembler
from harness.pipeline.gatekeeper import PolicyEngine
from harness.pipeline.plan_orchestrator import PlanOrchestrator
from harness.pipeline.queue import QueueLimits
from harness.pipeline.run_manager import RunManager
from harness.pipeline.tool_controller import Executor, ToolController
from harness.pipeline.tool_kinds import Lanes
from harness.policy.hitl import HitlDesk
from harness.policy.identity import IdentityDirectory
from harness.ports import Clock, LLMProvider, ResultSink, TraceBuffer
from harness.ports.changes import ChangeFeed
from harness.ports.contents import StoredContents
from harness.ports.leases import RunLeases
from harness.ports.queries import ReadModel
from harness.settings import Settings
from harness.skills.manifests import SkillRegistry
from harness.stores import knowledge_base, read_model, stored_contents
from harness.webhooks.config import WebhookConfig, load_webhook_config
from harness.webhooks.notifier import PushEvents, WebhookNotifier, WebhookResultSink
from harness.wiring.llm import call_budget, check_priced, llm_provider
from harness.wiring.sandbox import remote_sandbox, sandbox_pool, sandbox_provider
from harness.wiring.webhooks import webhook_sender

if TYPE_CHECKING:
    from harness.domain.contracts import RunRequest
    from harness.ports.segments import SegmentStore
    from harness.skills.mcp import McpServers
    from harness.webhooks.delivery import WebhookDispatcher


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
    runs: RunManager
    identities: IdentityDirectory
    webhooks: WebhookConfig | None = None
    webhook_outbox: WebhookOutbox | None = None
    agent: Agent | None = None
    mcp: McpServers | None = None
    #: wakes callers waiting for a Run to change (`Harness.events`, the service's SSE): this process's
    #: changes everywhere, every process's on PostgreSQL
    feed: ChangeFeed = field(default_factory=LocalChangeFeed)
    #: the tenants' knowledge bases: documents in, snippets for the context out
    knowledge: KnowledgeBase | None = None

    @property
    def reads(self) -> ReadModel:
        """The read model over this runtime's store (listings, the change feed, counts)."""
        return read_model(self.store)

    @property
    def contents(self) -> StoredContents:
        """The contents this runtime's trace references by hash (the blob store)."""
        return stored_contents(self.store)

    def dispatcher(self) -> WebhookDispatcher:
        """A delivery loop for this runtime's webhook outbox (the caller closes it)."""
        from harness.webhooks.delivery import WebhookDispatcher

        assert self.webhooks is not None and self.webhook_outbox is not None
        return WebhookDispatcher(self.webhook_outbox, self.webhooks, webhook_sender(self.webhooks.delivery.timeout_s))

    def close(self) -> None:
        """Release threads and connections."""
        self.runs.children.close()
        self.tools.close()
        if self.mcp is not None:
            self.mcp.close()  # stdio servers are stopped, not orphaned
        self.feed.close()
        self.store.close()


def skill_data_dir(settings: Settings, store: SqlStore) -> Path:
    """Where skills keep files of their own: a folder per database in the data directory, so that two
    databases (two checkouts, a test and a demo) never share the example's ledger."""
    return settings.data_dir / store.database_id()


def _artifact_store(url: str | None) -> SegmentStore | None:
    """Where a Run's artifacts go beside the database, when the settings name a place (the archive's
    segment stores, imported only then)."""
    if not url:
        return None
    from harness.wiring.retention import open_segment_store

    return open_segment_store(url)


def _check_callback(webhooks: WebhookConfig) -> Callable[[RunRequest], None]:
    """The check of a Run's callback URL against the webhook settings and the outbound rules, made when a
    Run asks for one (the HTTP sender's module, and its DNS resolver, loaded then)."""
    def check(request: RunRequest) -> None:
        from harness.domain.outbound import OutboundGuard
        from harness.settings import system_resolver

        webhooks.check_callback(request.tenant_id, request.callback or "", OutboundGuard(system_resolver))
    return check


def _release_workdir(tools: ToolController) -> Listener:
    """A Run's private working directory lives until the Run is final (kept while it awaits a human)."""
    def listener(run_id: str, _source: RunState, target: RunState) -> None:
        if target in FINAL:
            tools.release(run_id)
    return listener


def open_mcp(settings: Settings, registry: SkillRegistry) -> McpServers | None:
    """The MCP servers HARNESS_MCP_FILE names (they start at first use); they need the `mcp` extra."""
    if settings.mcp_file is None:
        return None
    try:
        from harness.adapters.mcp_client import McpClient
        from harness.skills.mcp import McpServers, load_mcp_file
    except ImportError as exc:
        raise InvalidRequestError("HARNESS_MCP_FILE needs the mcp package: pip install 'harness-kernel[mcp]'") from exc
    groups = {skill.id.split(".", 1)[0] for skill in registry.all()}
    return McpServers(load_mcp_file(settings.mcp_file), connector=McpClient(), config_path=settings.mcp_file,
                      reserved_groups=sorted(groups))


def mcp_kinds(mcp: McpServers | None, ledger: CostLedger, store: SqlStore) -> dict[str, Executor]:
    """The tool controller's executor of MCP tools: costs to the ledger, server restarts to the Run's audit."""
    if mcp is None:
        return {}
    from harness.skills.mcp import McpCalls

    def audit(run_id: str | None, event: str, detail: dict[str, object]) -> None:
        store.audit(run_id, event, "tool_controller", dict(detail))
    mcp.audit = audit
    return {"mcp": McpCalls(mcp, ledger.record)}


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
        agent = load_agent(settings.agent)
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


def change_feed(store: SqlStore, push: bool = True) -> ChangeFeed:
    """What wakes this process's waiters for a Run's changes: on PostgreSQL (through psycopg 3) with
    `push`, every process's changes (NOTIFY with each change, LISTEN here); elsewhere this process's only,
    the others' seen by polling. The store sends NOTIFY only when `push`."""
    store.notify_changes = push and listens(store.engine)
    return PgChangeFeed(store.engine) if store.notify_changes else LocalChangeFeed()


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
    hitl = HitlDesk(SqlApprovals(store), policy.policy.hitl)
    pricing = PricingTable.for_deployment(settings.llm_pricing)
    if provider is None:
        check_priced(settings, pricing, policy.policy.budgets.unpriced_model)
    provider = provider or llm_provider(settings, store.clock)
    secret_filter = SecretFilter()
    sandboxes = sandbox_pool(store, settings.pool_settings(), owner=f"{settings.sandbox_host}:{os.getpid()}",
                             ledger=ledger, price_per_s=pricing.sandbox_price, price_table=pricing.as_of,
                             remote=remote_sandbox(settings))
    tools = ToolController(registry, workdirs=Workdirs(settings.data_dir / "runs"),
                           data_dir=skill_data_dir(settings, store),
                           lanes=Lanes.sized(settings.local_skill_threads, settings.sandbox_threads,
                                             settings.llm_threads),
                           choose_sandbox=lambda: sandbox_provider(settings),
                           clock=store.clock, provider=provider, record_cost=ledger.record,
                           scrub=lambda text: secret_filter.scrub(text).text,
                           redact=lambda value: secret_filter.scrub_json(value)[0], sandbox_price=pricing.sandbox_price,
                           price_table=pricing.as_of, sandbox_pool=sandboxes, kinds=mcp_kinds(mcp, ledger, store),
                           artifact_limits=ArtifactLimits(settings.artifact_max_bytes, settings.artifact_max_count),
                           artifact_store=_artifact_store(settings.artifact_store),
                           stream_bytes=settings.sandbox_stream_bytes)
    machine.in_transaction(sandboxes.on_transition)  # instances end (and are billed) as their Run closes
    machine.subscribe(sandboxes.after_change)  # then their processes are stopped
    machine.cost_total = lambda run: ledger.run_total(run.run_id).to_dict()  # A1: child Runs included
    machine.subscribe(_release_workdir(tools))
    rows = SqlMemoryRows(store.engine, recall_window=settings.memory_recall_window)
    memory = open_memory(settings.memory, rows, store.clock, secret_filter)
    if memory is not None:
        machine.on_close(MemoryWriteBack(memory, settings.memory_write_scope))  # C5: SUCCEEDED only
    knowledge = open_knowledge(settings.knowledge, SqlKnowledgeRows(store.engine), store.clock, secret_filter)
    if knowledge is not None and memory is not None and memory.embedder is not None and knowledge.embedder:
        knowledge.embedder = memory.embedder  # one model in the process, not two
    identities = IdentityDirectory.from_file(settings.identities_file)
    encoding = None if settings.tokenizer == "auto" else settings.tokenizer
    assembler = ContextAssembler(tokenizer_for(settings.llm, settings.llm_model, encoding), memory=memory,
                                 secret_filter=secret_filter, memory_share=settings.memory_share,
                                 instructions=agent.instructions if agent is not None else None,
                                 knowledge=knowledge, knowledge_share=settings.knowledge_share,
                                 knowledge_bases=agent.knowledge_bases if agent is not None else (DEFAULT_KB,),
                                 agent_name=agent.name if agent is not None else None)
    webhooks = load_webhook_config(settings.webhooks_file)
    outbox = WebhookOutbox(store)
    notifier = WebhookNotifier(outbox, webhooks)
    if sink is not None or webhooks.sends_anything():  # with no endpoint nor secret, nothing is ever pushed
        pushes = PushEvents(notifier, sink or WebhookResultSink(notifier))
        machine.in_transaction(pushes.on_transition)  # results of every close and park (P4), in its transaction
        hitl.on_insert(pushes.on_request)  # approval requests opened or escalated (N1), in their transaction
    runs = RunManager(
        store=store, writes=SqlRunWrites(store, ledger), units=store, machine=machine, assembler=assembler,
        orchestrator=PlanOrchestrator(
            provider, registry, max_attempts=1 if isinstance(provider, GuardedProvider) else 3,
            lane=tools.lanes.llm),
        policy=policy, tools=tools, hitl=hitl, ledger=ledger, execution_limit_s=settings.execution_limit_s,
        chain_depth=settings.chain_depth, max_rounds=settings.max_rounds, limits=settings.limits,
        roles_of=identities.roles_of,
        check_callback=_check_callback(webhooks),
        child_leases=Leases(store, ttl_s=60.0),
        queue=QueueLimits(settings.max_backlog, settings.backlog_retry_after_s, settings.queue_max_wait_s),
        system_history=agent is not None and agent.system_history,
        call_budget=call_budget(settings, provider, policy, assembler),
    )
    tools.child_runs = runs  # AgentInvoke creates child Runs through the same kernel (T4)
    runtime = Runtime(settings, store, machine, registry, policy, hitl, tools, runs, identities,
                      webhooks, outbox, agent, mcp, change_feed(store, settings.events_push),
                      knowledge or knowledge_base(store, settings))
    machine.subscribe(lambda run_id, _source, _target: runtime.feed.changed(run_id))

    # every drive holds the Run's lease (K5b, T6), as the thread that drives it (owner host:pid:thread)
    def drive(run_id: str) -> RunResult | None:
        return LeasedDrive(store, runs, machine, open_leases(runtime, settings.lease_ttl_s), owner=default_owner(),
                           max_stalls=settings.max_stalls).execute(run_id)
    runs.driver = drive
    runs.children.leased_drive = runs.driver
    return runtime
