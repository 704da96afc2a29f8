"""The Python API: `Harness` for code that blocks, `AsyncHarness` for asyncio applications.

    from harness import Harness

    with Harness(db="helpdesk.db") as h:
        run = h.run("Refund order A-1003 if it was delivered", user="alice")
        if run.state == "AWAITING_HITL":
            h.approve(run.approval_request_id, as_="carol")
        print(h.wait(run.run_id).answer)

Every method goes through the same composition root as the CLI and the service (`build_runtime`): the
same kernel, policy, approvals and trace. Results are typed (Pydantic models): RunResult, RunEvent,
TraceEntry, ApprovalRequest, DecisionOutcome. Bad input raises a HarnessError subclass naming the
problem (InvalidRequestError, UnknownRunError, UnknownIdentityError ...).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from harness.agents import Agent, load_agent
from harness.config import Runtime, build_runtime
from harness.domain.contracts import Message, RunResult
from harness.kernel.states import FINAL, RunState
from harness.operations import Operations
from harness.pipeline import waits
from harness.ports import Clock, LLMProvider
from harness.ports.changes import ChangeWaiter
from harness.settings import Settings

if TYPE_CHECKING:
    from harness.knowledge.base import KnowledgeBase
    from harness.replay.facts import ReplayReport

__all__ = ["ApprovalRequest", "AsyncHarness", "DecisionOutcome", "Harness", "RunEvent", "TraceEntry"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class RunEvent(_Model):
    """One state change of a Run, in order: what `events` yields."""

    #: the Run's id
    run_id: str
    #: the change's number in the Run, from 0 (the Run's creation)
    seq: int
    #: the state it left (None for the creation)
    source: str | None
    #: the state it entered
    target: str
    #: who moved it (a pipeline component, the sweeper, a person)
    actor: str
    #: why, in words
    reason: str
    #: when, epoch seconds
    at: float
    #: the sweeper's rule, when the change was forced
    forced_by: str | None = None

    @property
    def final(self) -> bool:
        """True when the Run reached a final state with this change."""
        return RunState(self.target) in FINAL


class TraceEntry(_Model):
    """One record of a Run's hash-chained trace."""

    #: its position in the database's hash chain
    seq: int
    #: what it records (`transition`, `tool_call`, `policy_trace`, ...)
    kind: str
    #: its chain hash (covers the previous record's)
    hash: str
    #: what it records
    data: dict[str, Any]


class ApprovalRequest(_Model):
    """An approval request that waits for a decision."""

    #: the id `approve` and `reject` take
    request_id: str
    #: the Run that waits
    run_id: str
    #: the approval level (`L2` the requester confirms, `L3` a lead, `L4` two approvers)
    level: str
    #: who asked for the Run (`tenant/user`)
    requester: str
    #: how many distinct approvals it needs
    required_approvals: int
    #: the roles that may approve it
    approver_roles: tuple[str, ...]
    #: when it times out (and the Run is rejected), epoch seconds
    deadline_at: float
    #: the exact calls to approve: step, skill and arguments
    actions: list[dict[str, Any]]
    #: the hash the decision is bound to
    actions_hash: str


class DecisionOutcome(_Model):
    """What a decision did: accepted or refused (and why), and the Run as it now is."""

    #: whether the decision was taken
    accepted: bool
    #: `approved`, `rejected`, `recorded` (more approvals needed) or `refused`
    effect: str | None
    #: why it was refused, when it was
    refusal: str | None
    #: approvals recorded so far
    approvals: int
    #: approvals the request needs
    required_approvals: int
    #: the Run after the decision
    run: RunResult


class Harness:
    """Create Runs, follow them, decide their approvals and read their traces."""

    def __init__(self, agent: Agent | str | None = None, *, db: str | None = None, settings: Settings | None = None,
                 provider: LLMProvider | None = None, clock: Clock | None = None, poll_s: float = 0.05,
                 **overrides: Any) -> None:
        """`agent` (an Agent, `module:attr` naming one, or the path of an agent file) defaults to what the
        settings name (HARNESS_AGENT; the bundled support agent when they name none); `db` and other
        keyword arguments override the settings (HARNESS_* variables) field by field."""
        base = settings or Settings.from_env(db=db, **overrides)
        if isinstance(agent, str):
            agent = load_agent(agent)
        self.runtime: Runtime = build_runtime(base, clock=clock, provider=provider, agent=agent)
        self.poll_s = poll_s
        #: the clock `wait` and `events` count their timeouts by (the runtime's: injectable for tests)
        self.clock: Clock = self.runtime.store.clock
        self._knowledge: KnowledgeBase | None = None

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Release threads and database connections."""
        self.runtime.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ Runs

    def create(self, task: str, *, user: str = "anonymous", tenant: str = "default", session: str = "default",
               history: Sequence[Message | dict[str, str]] = (), idempotency_key: str | None = None,
               metadata: dict[str, str] | None = None, callback: str | None = None,
               token_budget: int | None = None, start_by: dt.datetime | str | None = None,
               team: str | None = None) -> RunResult:
        """Accept a Run (durable before this returns) without driving it: a worker, `wait` or `drive` does.
        The caller's roles come from the identity directory. `team` is the collaboration group the Run
        works for (its memory is recalled with the caller's own; child Runs work for it too).

        `start_by` (a datetime with its timezone, or ISO 8601 text) is the latest moment the Run may start:
        still waiting in the queue then, it is closed CLOSED_FAILED `not_started` instead of running late.
        When too many accepted Runs wait to start (HARNESS_MAX_BACKLOG) nothing is created and
        BacklogFullError says when to retry (`retry_after_s`)."""
        run, _ = self.runtime.runs.submit(self._request(task, user, tenant, session, history, idempotency_key,
                                                        metadata, callback, token_budget, start_by, team))
        return self.runtime.runs.result(run.run_id)

    def run(self, task: str, **kwargs: Any) -> RunResult:
        """Create a Run and drive it in this process until it is final or waits for an approval."""
        return self.drive(self.create(task, **kwargs).run_id)

    def drive(self, run_id: str) -> RunResult:
        """Carry the Run on in this process (under its lease) until it is final or parks."""
        return self.runtime.runs.drive(run_id)

    def get(self, run_id: str) -> RunResult:
        """The Run as it is now."""
        return self.runtime.runs.result(run_id)

    def wait(self, run_id: str, *, timeout_s: float | None = None, through_approvals: bool = False) -> RunResult:
        """Drive the Run (if nobody else does) and return it once it is final or, unless
        `through_approvals`, waiting for an approval; TimeoutError after `timeout_s` of the clock."""
        started = self.clock.now()
        with self.runtime.feed.subscribe(run_id, poll_s=self.poll_s) as changes:
            while True:
                result = self.drive(run_id)
                state = RunState(result.state)
                if state in FINAL or (state == RunState.AWAITING_HITL and not through_approvals):
                    return result
                left = None if timeout_s is None else timeout_s - (self.clock.now() - started)
                if left is not None and left <= 0:
                    raise TimeoutError(f"run {run_id} is still {state.value} after {timeout_s}s")
                _pause(changes, left)  # until the Run changes (in any process where the feed reaches it)

    def events(self, run_id: str, *, follow: bool = True, after_seq: int = 0,
               timeout_s: float | None = None) -> Iterator[RunEvent]:
        """The Run's state changes in order, from after `after_seq`. With `follow` the iterator waits for
        new ones until the Run is final (or `timeout_s` of the clock passed); without, it stops at the
        last recorded change."""
        seen, started = after_seq, self.clock.now()
        # subscribed before the first read: a change committed after it wakes the next pause
        with self.runtime.feed.subscribe(run_id, poll_s=self.poll_s) if follow else nullcontext() as changes:
            while True:
                for event in self._recorded(run_id, seen):
                    seen = event.seq
                    yield event
                    if event.final:
                        return
                left = None if timeout_s is None else timeout_s - (self.clock.now() - started)
                if changes is None or (left is not None and left <= 0):
                    return
                _pause(changes, left)

    def _recorded(self, run_id: str, after_seq: int) -> list[RunEvent]:
        """The Run's changes recorded so far after `after_seq`, read from the committed transitions."""
        return [RunEvent(run_id=run_id, seq=row.seq, source=row.from_state.value if row.from_state else None,
                         target=row.to_state.value, actor=row.actor, reason=row.reason, at=row.at,
                         forced_by=row.forced_by)
                for row in self.runtime.store.transitions_of(run_id) if row.seq > after_seq]

    def cancel(self, run_id: str, *, by: str = "operator", reason: str = "cancelled by the user") -> RunResult:
        """Cancel a Run that has not finished; CancelRefusedError when it had begun to close."""
        who = self.runtime.identities.resolve(by)
        return self.runtime.runs.cancel(run_id, by=f"{who.tenant_id}/{who.user_id}", reason=reason)

    # ------------------------------------------------------------------ approvals

    def approvals(self, run_id: str | None = None, *, tenant: str | None = None) -> list[ApprovalRequest]:
        """The approval requests waiting for a decision (of one Run, or of a tenant, or all)."""
        self.runtime.runs.expire_approvals()
        pending = [r for r in self.runtime.hitl.pending(tenant) if run_id is None or r.run_id == run_id]
        return [ApprovalRequest(request_id=r.request_id, run_id=r.run_id, level=r.level, requester=r.requester,
                                required_approvals=r.required_approvals, approver_roles=tuple(r.approver_roles),
                                deadline_at=r.deadline_at, actions=r.actions, actions_hash=r.actions_hash)
                for r in pending]

    def approve(self, request_id: str | None, *, as_: str, reason: str = "", break_glass: bool = False,
                resume: bool = True) -> DecisionOutcome:
        """Approve as the identity `as_` ("tenant/user" or "user"; roles from the identity directory).
        The approved Run is driven on in this process unless `resume` is False (a worker or `harness serve`
        drives it then). To drive it here this process needs the skills the approved steps call, as the Run
        pinned them: lacking one (another agent, changed code) raises SkillsUnavailableError, nothing recorded."""
        return self._decide("approve", request_id, as_, reason, break_glass, resume)

    def reject(self, request_id: str | None, *, as_: str, reason: str = "") -> DecisionOutcome:
        """Reject as the identity `as_`; any reject is final."""
        return self._decide("reject", request_id, as_, reason, False, False)

    def _decide(self, decision: str, request_id: str | None, as_: str, reason: str, break_glass: bool,
                resume: bool) -> DecisionOutcome:
        from harness.domain.errors import InvalidRequestError

        if not request_id:
            raise InvalidRequestError("no approval request id: the Run is not waiting for an approval")
        approver = self.runtime.identities.resolve(as_)
        verdict, result = self.runtime.runs.decide(request_id, approver, decision, reason=reason,
                                                   break_glass=break_glass, resume=resume)
        return DecisionOutcome(accepted=verdict.accepted, effect=verdict.effect, refusal=verdict.refusal,
                               approvals=verdict.approvals, required_approvals=verdict.request.required_approvals,
                               run=result)

    # ------------------------------------------------------------------ trace

    def trace(self, run_id: str) -> list[TraceEntry]:
        """The Run's records of the hash-chained trace, in chain order (pending ones are chained first)."""
        self.runtime.store.get_run(run_id)  # UnknownRunError for a Run that does not exist
        self.runtime.store.drain_all()
        return [TraceEntry(seq=r.seq, kind=r.kind, hash=r.hash, data=r.data())
                for r in self.runtime.store.trace_of(run_id)]

    def replay(self, run_id: str) -> ReplayReport:
        """Re-execute a finished Run from its recording on a scratch database and report any divergence."""
        from harness.replay.runner import replay

        return replay(run_id, self.runtime.store, self.runtime.settings, self.runtime.agent)

    # ------------------------------------------------------------------ knowledge bases

    @property
    def knowledge(self) -> KnowledgeBase:
        """The tenants' knowledge bases, the documents whose best-matching chunks a Run's context gives the
        model: `add` a Markdown, text or PDF file (`add_bytes` for content in memory), list `documents`,
        `remove` one, `search` in a caller's scope. Secrets are removed from a document's text before
        anything is stored. A file that cannot be read, is empty or of another kind raises DocumentError
        naming it and stores nothing; an unknown document raises UnknownDocumentError. Managed here even
        where the settings keep knowledge out of the context (HARNESS_KNOWLEDGE=off)."""
        if self._knowledge is None:
            from harness.stores import knowledge_base

            self._knowledge = self.runtime.knowledge or knowledge_base(self.runtime.store, self.runtime.settings)
        return self._knowledge

    @property
    def operations(self) -> Operations:
        """What operators need beyond this class, over the same runtime: Runs asked for with every field
        of the request, Run records, decisions with their verdict, approval timeouts, the cost ledger, the
        audit's checks (harness.operations)."""
        return Operations(self.runtime)

    @staticmethod
    def _request(task: str, user: str, tenant: str, session: str, history: Sequence[Message | dict[str, str]],
                 idempotency_key: str | None, metadata: dict[str, str] | None, callback: str | None,
                 token_budget: int | None, start_by: dt.datetime | str | None = None,
                 team: str | None = None) -> dict[str, Any]:
        request: dict[str, Any] = {"task": task, "user_id": user, "tenant_id": tenant, "session_id": session,
                                   "history": [m.model_dump() if isinstance(m, Message) else m for m in history]}
        for key, value in (("idempotency_key", idempotency_key), ("metadata", metadata), ("callback", callback),
                           ("token_budget", token_budget), ("start_by", start_by), ("team_id", team)):
            if value is not None:
                request[key] = value
        return request


class AsyncHarness:
    """`Harness` for asyncio applications (FastAPI and the like): the same methods, awaitable. A Run is
    driven on the caller's own event loop, switched out wherever it waits (a model, a skill's thread, a
    back-off, a change of the Run), so a thousand Runs awaited at once hold no thread each."""

    def __init__(self, agent: Agent | str | None = None, **kwargs: Any) -> None:
        """The same arguments as Harness; `sync` is the Harness underneath."""
        self.sync = Harness(agent, **kwargs)

    async def __aenter__(self) -> AsyncHarness:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Release threads and database connections."""
        await waits.run_in_greenlet(self.sync.close)

    async def create(self, task: str, **kwargs: Any) -> RunResult:
        """See Harness.create."""
        return await waits.run_in_greenlet(lambda: self.sync.create(task, **kwargs))

    async def run(self, task: str, **kwargs: Any) -> RunResult:
        """See Harness.run."""
        return await waits.run_in_greenlet(lambda: self.sync.run(task, **kwargs))

    async def get(self, run_id: str) -> RunResult:
        """See Harness.get."""
        return await waits.run_in_greenlet(lambda: self.sync.get(run_id))

    async def wait(self, run_id: str, **kwargs: Any) -> RunResult:
        """See Harness.wait (the waiting happens off the event loop)."""
        return await waits.run_in_greenlet(lambda: self.sync.wait(run_id, **kwargs))

    async def events(self, run_id: str, *, follow: bool = True, after_seq: int = 0,
                     timeout_s: float | None = None) -> AsyncIterator[RunEvent]:
        """See Harness.events: an async iterator; between changes it awaits the next one."""
        sync, seen = self.sync, after_seq
        started = sync.clock.now()
        with sync.runtime.feed.subscribe(run_id, poll_s=sync.poll_s) if follow else nullcontext() as changes:
            while True:
                for event in sync._recorded(run_id, seen):  # a short read, on the loop's thread
                    seen = event.seq
                    yield event
                    if event.final:
                        return
                left = None if timeout_s is None else timeout_s - (sync.clock.now() - started)
                if changes is None or (left is not None and left <= 0):
                    return
                await changes.wait_async(left)

    async def cancel(self, run_id: str, **kwargs: Any) -> RunResult:
        """See Harness.cancel."""
        return await waits.run_in_greenlet(lambda: self.sync.cancel(run_id, **kwargs))

    async def approvals(self, run_id: str | None = None, **kwargs: Any) -> list[ApprovalRequest]:
        """See Harness.approvals."""
        return await waits.run_in_greenlet(lambda: self.sync.approvals(run_id, **kwargs))

    async def approve(self, request_id: str | None, **kwargs: Any) -> DecisionOutcome:
        """See Harness.approve."""
        return await waits.run_in_greenlet(lambda: self.sync.approve(request_id, **kwargs))

    async def reject(self, request_id: str | None, **kwargs: Any) -> DecisionOutcome:
        """See Harness.reject."""
        return await waits.run_in_greenlet(lambda: self.sync.reject(request_id, **kwargs))

    async def trace(self, run_id: str) -> list[TraceEntry]:
        """See Harness.trace."""
        return await waits.run_in_greenlet(lambda: self.sync.trace(run_id))

    @property
    def knowledge(self) -> KnowledgeBase:
        """See Harness.knowledge (its calls are short database writes and reads, made on the caller's
        thread)."""
        return self.sync.knowledge

    @property
    def operations(self) -> Operations:
        """See Harness.operations (its calls are the runtime's own, made on the caller's thread)."""
        return self.sync.operations


def _pause(changes: ChangeWaiter, seconds: float | None) -> None:
    """Wait for the next change (or `seconds`): switched out when the caller is a drive on a loop
    (AsyncHarness), else blocking this thread."""
    if waits.suspendable():
        waits.wait(changes.wait_async(seconds))
    else:
        changes.wait(seconds)
