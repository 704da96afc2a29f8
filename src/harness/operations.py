"""The operator's face beside `Harness`: what the CLI, the HTTP service and an operator's own code need that a
library user does not (a Run asked for with every field of the request, Run records, decisions with their
verdict, approval timeouts, the cost ledger, the audit's checks, the store's health, the read views).

    from harness import Harness

    with Harness(db="helpdesk.db") as h:
        ops = h.operations
        run, created = ops.submit({"task": "Where is order A-1001?", "user_id": "alice", "team_id": "support"})
        print(ops.verify().ok)

The CLI and the service go through here (or `Harness`), never through the composition root's parts, so a
behaviour fixed here is fixed in every face. The drive machinery (`harness serve`'s worker, the sweeper)
is not a face: it is wired on the runtime itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.config import Runtime, build_runtime

if TYPE_CHECKING:
    from harness.audit.reconcile import ReconcileReport
    from harness.domain.approvals import HitlRequest
    from harness.domain.audit import ChainReport
    from harness.domain.contracts import CallerIdentity, RunRequest, RunResult
    from harness.domain.records import RunRecord, StoredTraceRecord, TransitionRow
    from harness.domain.retention import ArchivedRun
    from harness.drive.state_machine import Listener
    from harness.drive.sweeper import ZombieSweeper
    from harness.knowledge.base import KnowledgeBase
    from harness.policy.hitl import Decision, HitlDesk
    from harness.policy.identity import IdentityDirectory
    from harness.ports import Clock
    from harness.ports.changes import ChangeFeed
    from harness.ports.contents import StoredContents
    from harness.ports.ledger import CostLedger
    from harness.ports.queries import ReadModel
    from harness.ports.sandboxes import SandboxInstances
    from harness.ports.webhooks import WebhookDeliveries
    from harness.settings import Settings
    from harness.skills.manifests import SkillRegistry
    from harness.skills.mcp import McpServers
    from harness.stores import SqlStore
    from harness.webhooks.delivery import WebhookDispatcher


class Operations:
    """Runs, approvals, costs and the audit as an operator works them, over one runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @classmethod
    def open(cls, settings: Settings) -> Operations:
        """Operations over a runtime built from `settings` (the caller closes it)."""
        return cls(build_runtime(settings))

    def close(self) -> None:
        """Release the runtime's threads and database connections."""
        self._runtime.close()

    # ------------------------------------------------------------------ what the runtime is

    @property
    def settings(self) -> Settings:
        """The settings the runtime was built from (the agent's values under the explicit ones)."""
        return self._runtime.settings

    @property
    def clock(self) -> Clock:
        """The runtime's clock."""
        return self._runtime.store.clock

    @property
    def identities(self) -> IdentityDirectory:
        """Who is who: tenants, users, their roles and teams."""
        return self._runtime.identities

    @property
    def registry(self) -> SkillRegistry:
        """The skills Runs may use."""
        return self._runtime.registry

    @property
    def mcp(self) -> McpServers | None:
        """The MCP servers the settings name, when they name any."""
        return self._runtime.mcp

    @property
    def knowledge(self) -> KnowledgeBase | None:
        """The tenants' knowledge bases, when the runtime has them."""
        return self._runtime.knowledge

    @property
    def hitl(self) -> HitlDesk:
        """The approval desk: pending requests, their approvals, why a decision would be refused."""
        return self._runtime.hitl

    @property
    def reads(self) -> ReadModel:
        """The read model: listings, the change feed's cursor, jobs, decisions."""
        return self._runtime.reads

    @property
    def contents(self) -> StoredContents:
        """The contents the trace references by hash."""
        return self._runtime.contents

    @property
    def feed(self) -> ChangeFeed:
        """What wakes a caller waiting for a Run to change."""
        return self._runtime.feed

    @property
    def ledger(self) -> CostLedger:
        """The cost ledger: spend by Run, tenant, user, skill, day."""
        return self._runtime.runs.ledger

    @property
    def webhook_outbox(self) -> WebhookDeliveries | None:
        """The webhook deliveries waiting, done and dead."""
        return self._runtime.webhook_outbox

    @property
    def store(self) -> SqlStore:
        """The store, for the read views of harness.stores (the audit's reads, archived Runs, instances)."""
        return self._runtime.store

    def database_id(self) -> str:
        """The database's id (its checkpoints' folder)."""
        return self._runtime.store.database_id()

    def warm(self) -> None:
        """Load the context's vocabulary now rather than inside a Run's first step."""
        self._runtime.runs.assembler.warm()

    def on_change(self, listener: Listener) -> None:
        """Call `listener(run_id, source, target)` after each state change this process commits."""
        self._runtime.machine.subscribe(listener)

    def dispatcher(self) -> WebhookDispatcher:
        """A delivery loop for the webhook outbox (the caller closes it)."""
        return self._runtime.dispatcher()

    # ------------------------------------------------------------------ Runs

    def submit(self, request: RunRequest | dict[str, Any]) -> tuple[RunRecord, bool]:
        """Accept a Run with every field of the request (roles, team, idempotency key, start_by, chain
        depth ...), durable before this returns and not driven; (run, created): created is False when the
        caller's idempotency key returned an existing Run."""
        return self._runtime.runs.submit(request)

    def create_run(self, request: RunRequest | dict[str, Any]) -> RunResult:
        """Accept a Run and drive it in this process until it is final or waits for a human."""
        return self._runtime.runs.create_run(request)

    def run(self, run_id: str) -> RunRecord:
        """The Run's record; UnknownRunError when there is none."""
        return self._runtime.store.get_run(run_id)

    def result(self, run_id: str) -> RunResult:
        """The Run's result as it is now."""
        return self._runtime.runs.result(run_id)

    def transitions(self, run_id: str) -> list[TransitionRow]:
        """The Run's state changes, in order."""
        return self._runtime.store.transitions_of(run_id)

    def trace(self, run_id: str) -> list[StoredTraceRecord]:
        """The Run's hash-chained records, in chain order (pending ones chained first)."""
        self._runtime.store.drain_all()
        return self._runtime.store.trace_of(run_id)

    def archived(self, run_id: str) -> ArchivedRun | None:
        """Where an archived Run is, when it was archived and pruned."""
        from harness.stores import archived_run

        return archived_run(self._runtime.store, run_id)

    def cancel(self, run_id: str, *, by: str, reason: str = "cancelled by the user") -> RunResult:
        """Cancel a Run that has not finished; CancelRefusedError when it had begun to close."""
        return self._runtime.runs.cancel(run_id, by=by, reason=reason)

    # ------------------------------------------------------------------ approvals

    def decide(self, request_id: str, approver: CallerIdentity, decision: str, *, reason: str = "",
               approved_hash: str | None = None, break_glass: bool = False, resume: bool = True,
               driven_here: bool | None = None) -> tuple[Decision, RunResult]:
        """Judge and record a decision (with its verdict: accepted or refused and why, the approvals so far,
        how long the Run waited), then, unless not `resume`, drive an approved Run in this process;
        `driven_here` says this process's own worker will drive it (its skills are checked as for a resume)."""
        return self._runtime.runs.decide(request_id, approver, decision, approved_hash=approved_hash,
                                         break_glass=break_glass, reason=reason, resume=resume,
                                         driven_here=driven_here)

    def expire_approvals(self) -> list[str]:
        """Apply every due approval timeout; the ids of the requests it closed or escalated."""
        return self._runtime.runs.expire_approvals()

    def approval(self, request_id: str, tenant_id: str | None = None) -> HitlRequest:
        """One approval request (of `tenant_id` when given); UnknownRequestError otherwise."""
        return self._runtime.hitl.get(request_id, tenant_id)

    # ------------------------------------------------------------------ the audit and the store's health

    def verify(self) -> ChainReport:
        """Walk the whole hash chain (pending records chained first)."""
        from harness.audit.verify import verify_chain
        from harness.stores import audit_reads

        self._runtime.store.drain_all()
        return verify_chain(audit_reads(self._runtime.store))

    def reconcile(self) -> ReconcileReport:
        """Count Runs in each final state against their audit events (pending records chained first)."""
        from harness.audit.reconcile import reconcile
        from harness.stores import reconcile_reads

        self._runtime.store.drain_all()
        return reconcile(reconcile_reads(self._runtime.store))

    def trace_backlog(self) -> int:
        """How many trace records wait to be chained (a read of the database)."""
        return self._runtime.store.outbox_backlog()

    def probe_write(self) -> None:
        """Take a write (a row inserted in a transaction rolled back); the database's error when it cannot."""
        self._runtime.store.probe_write()

    def sandbox_instances(self) -> SandboxInstances:
        """The sandbox instances of every host."""
        from harness.stores import sandbox_instances

        return sandbox_instances(self._runtime.store)

    def sweeper(self, *, resume: bool) -> ZombieSweeper:
        """A zombie sweeper over the runtime (resuming the Runs it recovers when `resume`)."""
        from harness.drive.sweeper import ZombieSweeper

        rt = self._runtime
        return ZombieSweeper(rt.store, rt.machine, thresholds=rt.settings.thresholds(),
                             expire_approvals=rt.runs.expire_approvals, resume=rt.runs.drive if resume else None,
                             resume_decisions=rt.runs.resume_decisions, max_stalls=rt.settings.max_stalls)

    def prune_workdirs(self) -> list[str]:
        """Remove this host's working directories of Runs closed by any process; the Runs' ids."""
        return self._runtime.runs.prune_workdirs()
