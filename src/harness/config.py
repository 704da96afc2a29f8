"""The composition root: one place that wires ports to adapters (SPEC D1).

`build_runtime` builds a Runtime from Settings (harness.settings, importable from here as before); the
factories beside it (`open_store`, `read_model`, `cost_ledger`, ...) are how the shells and the library API
get an adapter without naming one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness import settings as _settings
from harness.adapters.change_feed import LocalChangeFeed
from harness.adapters.llm.factory import make_provider
from harness.adapters.llm.pricing import PricingTable
from harness.adapters.llm.resilient import GuardedProvider, ProviderSettings
from harness.adapters.llm.scripted import ScriptedProvider
from harness.adapters.s3_segments import S3SegmentStore
from harness.adapters.sandbox import Workdirs, select_sandbox
from harness.adapters.sandbox.instance import HolderProcesses
from harness.adapters.sandbox.providers import ProviderChoice
from harness.adapters.sql import database
from harness.adapters.sql.approvals import SqlApprovals
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.blobs import BlobStore
from harness.adapters.sql.erasure import ErasureStore
from harness.adapters.sql.knowledge import SqlKnowledgeRows
from harness.adapters.sql.leases import Leases
from harness.adapters.sql.ledger import CostLedger
from harness.adapters.sql.memory import SqlMemoryRows
from harness.adapters.sql.pg_listen import PgChangeFeed, listens
from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.replay_reads import ReplayReads
from harness.adapters.sql.replay_reads import set_deadline as replay_set_deadline
from harness.adapters.sql.retention import RetentionStore
from harness.adapters.sql.run_queries import RunQueries
from harness.adapters.sql.run_writes import SqlRunWrites
from harness.adapters.sql.sandbox_instances import InstanceTable
from harness.adapters.sql.store import SqlStore, open_existing
from harness.adapters.sql.webhooks import WebhookOutbox
from harness.adapters.webhook_http import WebhookSender, system_resolver
from harness.agents import Agent, load_agent, support_agent
from harness.audit.checkpoint import checkpoint_dir
from harness.audit.witness import Witness, open_witness
from harness.context.secrets import SecretFilter
from harness.context.tokenizer import tokenizer_for
from harness.domain.contracts import RunResult
from harness.domain.errors import InvalidRequestError
from harness.domain.llm import LLMRequest
from harness.domain.outbound import OutboundGuard
from harness.domain.sandbox import PoolSettings
from harness.drive.leased import LeasedDrive, default_owner
from harness.drive.state_machine import Listener, StateMachine
from harness.kernel import FINAL, RunState
from harness.knowledge.base import DEFAULT_KB, KnowledgeBase, open_knowledge
from harness.memory.store import open_memory
from harness.memory.writeback import MemoryWriteBack
from harness.pipeline.artifacts import ArtifactLimits
from harness.pipeline.call_budget import CallBudget, TokenPrice
from harness.pipeline.context_assembler import ContextAssembler
from harness.pipeline.gatekeeper import PolicyEngine
from harness.pipeline.plan_orchestrator import PlanOrchestrator
from harness.pipeline.queue import QueueLimits
from harness.pipeline.run_manager import RunManager
from harness.pipeline.sandbox_pool import SandboxPool
from harness.pipeline.tool_controller import Executor, ToolController
from harness.pipeline.tool_kinds import Lanes
from harness.policy.hitl import HitlDesk
from harness.policy.identity import IdentityDirectory
from harness.ports import Clock, LLMProvider, ResultSink, Sandbox, TraceBuffer
from harness.ports.audit import AuditReads, ReconcileReads
from harness.ports.changes import ChangeFeed
from harness.ports.contents import StoredContents
from harness.ports.leases import RunLeases
from harness.ports.ledger import CostBook
from harness.ports.queries import ReadModel
from harness.ports.retention import ArchiveRows, ErasureRows
from harness.ports.sandboxes import SandboxInstances
from harness.ports.segments import SegmentLocator, SegmentStore
from harness.ports.signer import Signer
from harness.retention import storage
from harness.retention.archiver import Archiver
from harness.retention.erase import EraseReport
from harness.retention.erase import erase_user as _erase_user
from harness.retention.policy import RetentionPolicy
from harness.retention.scheduled import ArchiverFactory
from harness.skills.manifests import SkillRegistry

# the read side lives in harness.stores (a command that only reads starts on it alone); offered here too
from harness.stores import DatabaseError as DatabaseError  # noqa: PLC0414 (re-exported)
from harness.stores import approval_rows as approval_rows  # noqa: PLC0414 (re-exported)
from harness.stores import archived_run as archived_run  # noqa: PLC0414 (re-exported)
from harness.stores import cost_ledger as cost_ledger  # noqa: PLC0414 (re-exported)
from harness.stores import open_store as open_store  # noqa: PLC0414 (re-exported)
from harness.webhooks.config import WebhookConfig, load_webhook_config
from harness.webhooks.delivery import WebhookDispatcher
from harness.webhooks.notifier import PushEvents, WebhookNotifier, WebhookResultSink

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    from harness.adapters.signer_socket import SignerServer
    from harness.skills.mcp import McpServers


#: how a process is configured (harness.settings), importable from here as before
Settings = _settings.Settings
parse_port_range = _settings.parse_port_range

#: the model name and endpoint of HARNESS_LLM=local when HARNESS_LLM_MODEL / HARNESS_LLM_BASE_URL say nothing
LOCAL_MODEL = "smollm2-135m-instruct"
LOCAL_URL = "http://127.0.0.1:8080/v1"


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
        assert self.webhooks is not None and self.webhook_outbox is not None
        return WebhookDispatcher(self.webhook_outbox, self.webhooks, WebhookSender(self.webhooks.delivery.timeout_s))

    def close(self) -> None:
        """Release threads and connections."""
        self.runs.children.close()
        self.tools.close()
        if self.mcp is not None:
            self.mcp.close()  # stdio servers are stopped, not orphaned
        self.feed.close()
        self.store.close()


#: what the store raises when its database fails (the shells answer 503 or exit 2), and whether a failure is
#: an outage (down, locked, read-only: a retry later may succeed) rather than a bug
is_outage = database.is_outage


def skill_data_dir(settings: Settings, store: SqlStore) -> Path:
    """Where skills keep files of their own: a folder per database in the data directory, so that two
    databases (two checkouts, a test and a demo) never share the example's ledger."""
    return settings.data_dir / store.database_id()


def webhook_outbox(store: SqlStore) -> WebhookOutbox:
    """The webhook deliveries waiting, done and dead, over a store."""
    return WebhookOutbox(store)


def sandbox_instances(store: SqlStore) -> SandboxInstances:
    """The sandbox instances of every host, over a store."""
    return InstanceTable(store)


def sandbox_provider(settings: Settings) -> Sandbox:
    """The sandbox of the settings: this host's (bubblewrap, or the rlimit fallback), a sandbox server's
    (HARNESS_SANDBOX_PROVIDER=remote, HARNESS_SANDBOX_URL, HARNESS_SANDBOX_TOKEN), or this host's with some
    tenants' or skills' calls sent to the server."""
    remote_some = settings.sandbox_remote_tenants or settings.sandbox_remote_skills
    if settings.sandbox_provider == "local" and not remote_some:
        return select_sandbox(settings.sandbox)
    if not settings.sandbox_url:
        raise InvalidRequestError("the remote sandbox provider needs HARNESS_SANDBOX_URL (the sandbox server's URL)")
    from harness.adapters.sandbox.remote import RemoteSandbox  # httpx, only when a remote provider is set

    remote = RemoteSandbox(settings.sandbox_url, os.environ.get("HARNESS_SANDBOX_TOKEN", ""))
    if settings.sandbox_provider == "remote":
        return remote
    return ProviderChoice(lambda: select_sandbox(settings.sandbox), remote,
                          remote_tenants=settings.sandbox_remote_tenants, remote_skills=settings.sandbox_remote_skills)


def sandbox_server(settings: Settings, token: str, host: str, port: int) -> ThreadingHTTPServer:
    """`harness sandbox serve`: this host's sandbox (by HARNESS_SANDBOX) over HTTP, accepting only `token`."""
    from harness.adapters.sandbox.server import make_server

    return make_server(select_sandbox(settings.sandbox), token, host, port)


def sandbox_pool(store: SqlStore, pool: PoolSettings, *, owner: str, ledger: CostBook | None = None,
                 price_per_s: float = 0.0, price_table: str | None = None) -> SandboxPool:
    """This host's sandbox pool over a store's instance table, with the processes of this host; a kept
    instance's seconds are booked to `ledger` (none: not booked)."""
    return SandboxPool(InstanceTable(store), HolderProcesses(), pool, owner=owner, ledger=ledger,
                       price_per_s=price_per_s, price_table=price_table)


#: the store the composition root opens: shells name it in signatures where they hand a store on to code
#: typed against it, and never build one themselves
Store = SqlStore


# ---------------------------------------------------------------------- retention: archive and erasure


def archive_rows(store: SqlStore) -> ArchiveRows:
    """The archive's port over a store: what an archive pass reads, and its one prune."""
    return RetentionStore(store)


def erasure_rows(store: SqlStore) -> ErasureRows:
    """The erasure's port over a store."""
    return ErasureStore(store)


def open_segment_store(url: str | None = None, endpoint: str | None = None) -> SegmentStore:
    """The segment store `url` names (default HARNESS_ARCHIVE_URL, else ./harness-archive): a directory,
    or an S3-compatible bucket (s3://bucket/prefix, at `endpoint` or HARNESS_ARCHIVE_S3_ENDPOINT)."""
    return storage.open_segment_store(url, endpoint, s3=S3SegmentStore)


def segment_locator(endpoint: str | None = None) -> SegmentLocator:
    """Finds the store holding a segment from its location (a file:// or s3:// URL)."""
    return lambda location: storage.store_of(location, endpoint, s3=S3SegmentStore)


def read_location(location: str, endpoint: str | None = None) -> bytes:
    """The bytes of the segment at `location`."""
    return segment_locator(endpoint)(location).get(location)


def checkpoint_signer(settings: Settings) -> Signer | None:
    """The signer process HARNESS_SIGNER_SOCKET names; None: this process signs with its own key file."""
    if settings.signer_socket is None:
        return None
    from harness.adapters.signer_socket import SocketSigner

    return SocketSigner(settings.signer_socket)


def signer_server(socket_path: Path, key_file: Path, allowed_uids: Sequence[int] = (),
                  databases: Sequence[str] = ()) -> SignerServer:
    """The `harness signer serve` process's server: the key read from `key_file` (mode 0600)."""
    from harness.adapters.signer_socket import SignerServer
    from harness.audit.keys import read_private_key

    return SignerServer(socket_path, read_private_key(key_file), allowed_uids=allowed_uids, databases=databases)


def make_archiver(store: SqlStore, directory: Path | None, witnesses: Sequence[str],
                  policy: RetentionPolicy | None = None, segments: SegmentStore | None = None,
                  signer: Signer | None = None) -> Archiver:
    """An archiver as the settings describe it (HARNESS_ARCHIVE_URL, the checkpoint directory, the signer)."""
    ws: list[Witness] = [open_witness(w) for w in witnesses]
    return Archiver(RetentionStore(store), segments or open_segment_store(),
                    directory or checkpoint_dir(None, store.database_id()),
                    policy=policy or RetentionPolicy.from_env(), witnesses=ws, signer=signer)


def archiver_factory(store: SqlStore, directory: Path | None,
                     witnesses: Sequence[str], signer: Signer | None = None) -> ArchiverFactory:
    """Makes the archiver of each scheduled pass (the segment store is opened per pass, from the settings)."""
    return lambda policy: make_archiver(store, directory, witnesses, policy, signer=signer)


def erase_user(store: SqlStore, tenant_id: str, user_id: str, *, salt: bytes | None = None,
               endpoint: str | None = None, segments: SegmentStore | None = None, vacuum: bool = True,
               vacuum_full: bool = False) -> EraseReport:
    """Erase a person's data from the database and the archive (harness.retention.erase.erase_user)."""
    return _erase_user(ErasureStore(store), tenant_id, user_id, salt=salt, segments=segments,
                       locate=segment_locator(endpoint), vacuum=vacuum, vacuum_full=vacuum_full)


def replay_reads(store: SqlStore) -> ReplayReads:
    """What a replay reads of a recorded Run beyond the store's reads (outbox, blobs, decisions, history)."""
    return ReplayReads(store)


def set_deadline(store: SqlStore, run_id: str, deadline_at: float) -> None:
    """Give a replayed Run the deadline its recorded original had."""
    replay_set_deadline(store, run_id, deadline_at)


def open_existing_store(db: str | None) -> SqlStore:
    """The store named by `db`, refusing to create a new SQLite file (InvalidRequestError)."""
    return open_existing(db)


def webhook_sender(timeout_s: float) -> WebhookSender:
    """A signed HTTP sender of webhook events (the caller closes it)."""
    return WebhookSender(timeout_s)


def read_model(store: SqlStore) -> ReadModel:
    """The read model (listings, the change feed, counts) over a store."""
    return RunQueries(store)


def stored_contents(store: SqlStore) -> StoredContents:
    """The contents the trace references by hash (files a sandboxed skill kept among them), over a store."""
    return BlobStore(store.engine)


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
        plan_max_steps=settings.llm_plan_max_steps or (1 if local else 8), top_p=settings.llm_top_p), clock=clock)


def call_budget(settings: Settings, provider: LLMProvider, policy: PolicyEngine,
                assembler: ContextAssembler) -> CallBudget:
    """The check of a model call's worst case against the budget caps, made before the call, at the price
    the provider says (the scripted rules' or the price table's), or, for a provider that says none (a
    replay's), at the price the settings give the deployment's model."""
    if isinstance(provider, ScriptedProvider | GuardedProvider):
        priced = provider.token_price
    elif settings.llm == "scripted":
        priced = ScriptedProvider.from_file(settings.llm_rules).token_price
    else:
        table = PricingTable.for_deployment(settings.llm_pricing)
        model = settings.llm_model or (LOCAL_MODEL if settings.llm == "local" else "")

        def priced(request: LLMRequest) -> tuple[float, float] | None:
            return table.token_price(request.model or model, settings.llm_fallback_model)

    def price(request: LLMRequest) -> TokenPrice | None:
        rates = priced(request)
        return TokenPrice(*rates) if rates is not None else None

    return CallBudget(policy.budget_room, price, assembler.tokenizer.count)


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


def knowledge_base(store: SqlStore, settings: Settings | None = None) -> KnowledgeBase:
    """The knowledge bases over a store, for ingestion and listing: searched and embedded as the settings say
    (HARNESS_KNOWLEDGE=semantic embeds each chunk as it is added; off still lets documents be managed)."""
    mode = (settings or Settings.from_env()).knowledge
    found = open_knowledge("lexical" if mode == "off" else mode, SqlKnowledgeRows(store.engine), store.clock,
                           SecretFilter())
    assert found is not None
    return found


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
                             ledger=ledger, price_per_s=pricing.sandbox_price, price_table=pricing.as_of)
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
                           artifact_store=open_segment_store(settings.artifact_store) if settings.artifact_store
                           else None,
                           stream_bytes=settings.sandbox_stream_bytes)
    machine.in_transaction(sandboxes.on_transition)  # instances end (and are billed) as their Run closes
    machine.subscribe(sandboxes.after_change)  # then their processes are stopped
    machine.cost_total = lambda run: ledger.run_total(run.run_id).to_dict()  # A1: child Runs included
    machine.subscribe(_release_workdir(tools))
    memory = open_memory(settings.memory, SqlMemoryRows(store.engine), store.clock, secret_filter)
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
        check_callback=lambda request: webhooks.check_callback(request.tenant_id, request.callback or "",
                                                               OutboundGuard(system_resolver)),
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
