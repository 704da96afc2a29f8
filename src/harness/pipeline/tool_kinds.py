"""The four ways a skill call runs (SPEC T4): local (in process), sandbox (isolated process),
llm (the Runtime's LLM provider as a tool) and agent (a child Run through the same kernel).

Each executor takes one Attempt (the call and the seconds it may use), returns the skill's output or
raises, and notes in `attempt.info` what the ToolTrace should say (isolation level, child run id). Retries,
breakers, fallbacks and tracing are the tool controller's; this module only runs one attempt.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from harness.domain.contracts import CallerIdentity, Message, RunRequest, RunResult
from harness.domain.errors import ContextError, SkillError
from harness.domain.llm import LLMRequest, LLMResponse
from harness.domain.plans import render_template
from harness.domain.records import NewRun
from harness.domain.sandbox import SandboxJob, SandboxOutcome
from harness.domain.traces import CostTrace, unit_price
from harness.pipeline import waits
from harness.pipeline.artifacts import Collector
from harness.pipeline.sandbox_pool import SandboxPool, SandboxUnavailableError
from harness.pipeline.waits import Lane
from harness.ports import LLMProvider, Sandbox
from harness.ports.workdirs import Workdirs
from harness.skills.manifests import Skill, SkillContext

if TYPE_CHECKING:
    from harness.ports.runs import RunStore

Info = dict[str, Any]


class RetryableSkillError(Exception):
    """Raised by a skill for a transient failure that is worth retrying (like a 5xx or a 429)."""


class StepTimeoutError(Exception):
    """A call ran past its time: the manifest's timeout ("step") or the Run's remaining limit ("run")."""

    def __init__(self, message: str, limit: Literal["step", "run"] = "step") -> None:
        super().__init__(message)
        self.limit = limit


class ToolCallError(SkillError):
    """A call failed in a way with a stable name: a sandbox limit or escape, an LLM answer that is not
    usable, a child Run that did not succeed."""

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


@dataclass
class Attempt:
    """One attempt at a call, as an executor gets it: `timeout` is what it may use, `limit` which
    limit that is (the manifest's "step" timeout or the Run's remaining "run" time); the executor notes
    in `info` what the ToolTrace should say (isolation, child_run_id)."""

    skill: Skill
    arguments: dict[str, Any]
    ctx: SkillContext
    caller: CallerIdentity
    timeout: float
    limit: Literal["step", "run"]
    info: Info = field(default_factory=dict)
    #: the time.monotonic() at which the Run's execution limit ends (None: no limit)
    run_deadline: float | None = None

    def late(self) -> StepTimeoutError:
        """The error for running out of time."""
        if self.limit == "run":
            message = f"{self.skill.id} stopped after {self.timeout:.3g}s: the Run's execution limit passed"
        else:
            message = f"{self.skill.id} ran longer than {self.timeout:.3g}s"
        return StepTimeoutError(message, self.limit)


def render_prompt(skill: Skill, arguments: dict[str, Any]) -> str:
    """The manifest's prompt with `{argument}` placeholders filled in."""
    try:
        return render_template(skill.manifest.prompt or "", arguments)
    except KeyError as exc:
        raise ToolCallError("invalid_arguments", f"{skill.id}'s prompt needs {exc}") from exc


@dataclass
class Lanes:
    """A lane of threads for each kind of call that cannot wait without one (harness.pipeline.waits):
    local skills, sandboxed skills and model calls of a provider without asynchronous I/O. Separate lanes,
    so a burst of one kind never starves another."""

    local: Lane
    sandbox: Lane
    llm: Lane

    @classmethod
    def sized(cls, local: int = 32, sandbox: int = 32, llm: int = 32) -> Lanes:
        """Lanes of these many threads each."""
        return cls(Lane("local", local, in_process=True), Lane("sandbox", sandbox), Lane("llm", llm))

    def all(self) -> tuple[Lane, ...]:
        """Every lane."""
        return (self.local, self.sandbox, self.llm)

    def close(self) -> None:
        """Take no more calls on any lane."""
        for lane in self.all():
            lane.close()


def on_lane(lane: Lane, fn: Callable[[], Any], call: Attempt) -> Any:
    """Run `fn` on the lane: its timeout starts when a thread picks it up (the thread cannot be killed;
    a skill that must be stoppable belongs in the sandbox), and the Run's execution limit bounds both the
    wait for a thread and the call."""
    return lane.run(fn, timeout=call.timeout, until=call.run_deadline, late=call.late,
                    queue_late=lambda: StepTimeoutError(
                        f"{call.skill.id} did not start before the Run's execution limit passed", "run"))


def complete(provider: LLMProvider, request: LLMRequest, lane: Lane, timeout: float | None = None) -> LLMResponse:
    """One completion, waited for without holding a drive's thread: a provider that waits by itself
    (asynchronous I/O, or none at all: the scripted one) is called in the drive, which switches out while
    it waits; any other provider runs on the model lane. Past `timeout` seconds from its start: a
    TimeoutError."""
    if getattr(provider, "waits_itself", False):
        if waits.suspendable():
            with waits.deadline(timeout):
                return provider.complete(request)
        if timeout is None:
            return provider.complete(request)
    elif timeout is None and not waits.suspendable():
        return provider.complete(request)
    return lane.run(lambda: provider.complete(request), timeout=timeout)


class LocalCalls:
    """Skills run in this process, on the local lane's threads."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane

    def __call__(self, call: Attempt) -> Any:
        return on_lane(self.lane, lambda: call.skill.fn(dict(call.arguments), call.ctx), call)


class SandboxCalls:
    """Skills run in an isolated process with the Run's private working directory. What a call printed and
    the files it wrote there are collected (harness.pipeline.artifacts) into `attempt.info["leftovers"]`,
    whether it succeeded or not."""

    def __init__(self, sandbox: Callable[[], Sandbox], workdirs: Workdirs,
                 record_cost: Callable[[CostTrace], None] | None = None, price_per_s: float = 0.0,
                 price_table: str | None = None, pool: SandboxPool | None = None,
                 lane: Lane | None = None, collector: Collector | None = None, stream_bytes: int = 16_384) -> None:
        self.sandbox = sandbox
        #: what a call printed and the files it wrote; None: neither is kept
        self.collector = collector
        #: the most bytes of a call's stdout, and of its stderr, kept
        self.stream_bytes = stream_bytes
        #: the threads that wait for sandboxed processes while drives on a drive loop switch out
        self.lane = lane
        self.workdirs = workdirs
        #: instances, caps and ports (harness.pipeline.sandbox_pool); None: a fresh sandbox per call
        self.pool = pool
        #: a sandboxed call's seconds are a cost (seed 004 §3.6), priced per second, recorded even when
        #: the call fails: the time was spent
        self.record_cost = record_cost
        self.price_per_s = price_per_s
        self.price_table = price_table

    def __call__(self, call: Attempt) -> Any:
        sandbox, skill, ctx = self.sandbox(), call.skill, call.ctx
        choose = getattr(sandbox, "for_call", None)  # settings choosing the provider per skill or tenant
        if choose is not None:
            sandbox = choose(skill.id, ctx.tenant_id)
        call.info["isolation"] = sandbox.isolation
        provider = getattr(sandbox, "provider", "local")
        if provider != "local":
            call.info["sandbox_provider"] = provider
        entry = skill.entry
        assert entry is not None  # a sandboxed skill is a python skill, which has an entrypoint
        workdir = self.workdirs.ensure(ctx.run_id)
        context = {"run_id": ctx.run_id, "step_id": ctx.step_id, "idempotency_key": ctx.idempotency_key,
                   "tenant_id": ctx.tenant_id, "user_id": ctx.user_id, "workdir": str(workdir)}
        job = SandboxJob(
            skill_id=skill.id, function=entry.function, arguments=dict(call.arguments), context=context,
            workdir=workdir, wall_s=call.timeout, limits=skill.manifest.limits,
            network=skill.manifest.network, entry_file=entry.file, entry_module=entry.module,
            entry_sha256=entry.sha256, python_path=entry.python_path, code_paths=entry.code_paths,
            stream_bytes=self.stream_bytes,
        )
        before = self.collector.stamps(ctx.run_id) if self.collector is not None else None
        persistent = skill.manifest.persistent
        outcome = waits.call_blocking(
            lambda: sandbox.run(job) if self.pool is None else self._in_instance(call, sandbox, job, persistent),
            self.lane)
        if not (persistent and self.pool is not None):  # a kept instance's seconds are billed when it ends
            self._record(call, sandbox.isolation, outcome.duration_ms / 1000)
        if self.collector is not None and before is not None:
            call.info["leftovers"] = self.collector.collect(ctx.run_id, ctx.step_id, before, outcome.stdout,
                                                            outcome.stderr)
        if outcome.ok:
            return outcome.output
        if outcome.error_code == "timeout":
            raise call.late()
        detail = f" (stderr: {outcome.stderr_tail.strip()[-300:]})" if outcome.stderr_tail.strip() else ""
        raise ToolCallError(outcome.error_code or "sandbox_error", f"{outcome.message}{detail}",
                            retryable=outcome.retryable)

    def _in_instance(self, call: Attempt, sandbox: Sandbox, job: SandboxJob, persistent: bool) -> SandboxOutcome:
        """Run the call in the Run's instance of the skill: taken (or waited for) within the call's time."""
        assert self.pool is not None
        try:
            lease = self.pool.lease(sandbox, job, tenant_id=call.ctx.tenant_id, user_id=call.ctx.user_id,
                                    persistent=persistent, ports=call.skill.manifest.ports,
                                    deadline=time.monotonic() + call.timeout)
        except SandboxUnavailableError as exc:
            raise ToolCallError("sandbox_unavailable", str(exc)) from exc
        call.info["sandbox_instance"] = lease.event
        job = replace(job, wall_s=max(call.timeout - lease.waited_s, 0.001), env=lease.env)
        return sandbox.run_in(lease.holder, job) if persistent else sandbox.run(job)

    def _record(self, call: Attempt, isolation: str, seconds: float) -> None:
        if self.record_cost is None:
            return
        ctx = call.ctx
        price: dict[str, float | str] = {"sandbox_per_s": self.price_per_s}
        if self.price_table:
            price["table"] = self.price_table
        self.record_cost(CostTrace(run_id=ctx.run_id, source=f"sandbox:{isolation}:{call.skill.id}",
                                   sandbox_s=round(seconds, 6), usd=round(seconds * self.price_per_s, 8),
                                   unit_price=price, tenant_id=ctx.tenant_id, user_id=ctx.user_id,
                                   skill_id=call.skill.id))


class LlmCalls:
    """The Runtime's LLM provider as a tool: the manifest's prompt, filled in, is one completion."""

    def __init__(self, provider: Callable[[], LLMProvider | None], lane: Lane,
                 record_cost: Callable[[CostTrace], None] | None,
                 scrub: Callable[[str], str] | None = None) -> None:
        self.provider = provider
        self.lane = lane
        self.record_cost = record_cost
        #: the context assembler's secret filter: a prompt built from earlier tool outputs may carry
        #: secrets, and it goes to a model just like the planning context does (SPEC C4)
        self.scrub = scrub

    def __call__(self, call: Attempt) -> Any:
        provider, skill, ctx = self.provider(), call.skill, call.ctx
        if provider is None:
            raise ToolCallError("llm_unavailable", f"{skill.id} needs an LLM provider; the Runtime has none")
        prompt = render_prompt(skill, call.arguments)
        if self.scrub is not None:
            try:
                prompt = self.scrub(prompt)
            except ContextError as exc:  # the filter could not be sure: refuse rather than leak
                raise ToolCallError("secret_filter_failed", f"{skill.id}: {exc}") from exc
        request = LLMRequest(purpose="tool", system=skill.manifest.description,
                             messages=(Message(role="user", content=prompt),))
        try:
            response = complete(provider, request, self.lane, call.timeout)
        except TimeoutError as exc:
            raise call.late() from exc
        if self.record_cost is not None:
            usage = response.usage
            self.record_cost(CostTrace(run_id=ctx.run_id, source=f"llm:{response.provider}:tool:{skill.id}",
                                       input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                                       api_calls=1, usd=usage.cost_usd, unit_price=unit_price(usage),
                                       priced=usage.priced, model=response.model, tenant_id=ctx.tenant_id,
                                       user_id=ctx.user_id, skill_id=skill.id))
        if skill.manifest.output == "text":
            return {"text": response.content, "model": response.model}
        try:
            return json.loads(response.content)
        except ValueError as exc:
            raise ToolCallError("invalid_llm_output", f"{skill.id} expected JSON from the model: {exc}") \
                from exc


@dataclass(frozen=True)
class ChildWait:
    """How a parent's wait for its child ended: the child's final result, or why the parent stopped
    waiting first ("deadline": its own deadline passed and the child was cancelled; "superseded": the
    parent left EXECUTING, or lost its lease to a driver that will re-attach to the same child)."""

    result: RunResult | None
    stopped: Literal["deadline", "superseded"] | None = None
    detail: str = ""


class ChildDriver(Protocol):
    """What AgentInvoke needs of the Run manager: its store, the default delegation depth, and waiting
    for a child Run until it ends (driving it under its lease when nobody else does)."""

    chain_depth: int

    @property
    def store(self) -> RunStore: ...

    def await_child(self, parent_id: str, child_id: str, until: float) -> ChildWait:
        """Drive or wait for the child until it is final, or until time.monotonic() passes `until`."""
        ...


class AgentCalls:
    """AgentInvoke: the manifest's prompt becomes the task of a child Run, created and driven through the
    same kernel with the parent's caller, linked both ways, and due by the parent's remaining time.

    The child is created once: its idempotency key is the parent's (run, step), so a re-run of the step —
    after the parent's worker died, say — re-attaches to the same child. A child that waits for a human
    leaves the parent waiting in EXECUTING, as for any slow call, until the child ends or the time given
    to it passes (then the child is cancelled and the step times out)."""

    def __init__(self, runs: Callable[[], ChildDriver | None]) -> None:
        self.runs = runs

    def __call__(self, call: Attempt) -> Any:
        runs, skill, ctx, caller = self.runs(), call.skill, call.ctx, call.caller
        if runs is None:
            raise ToolCallError("agent_unavailable", f"{skill.id} needs a Run manager to start child Runs")
        parent = runs.store.get_run(ctx.run_id)
        remaining = self._chain_remaining(runs, parent.request.get("chain_remaining"), parent.parent_run_id)
        if remaining <= 0:  # the gatekeeper refuses such a plan; this guards a fallback or an older Run
            raise ToolCallError("agent_depth_limit", f"{skill.id}: this Run may not start child Runs "
                                                     "(its delegation budget, chain_remaining, is spent)")
        request = RunRequest(
            task=render_prompt(skill, call.arguments), tenant_id=caller.tenant_id, user_id=caller.user_id,
            session_id=parent.session_id, team_id=parent.request.get("team_id"), roles=caller.roles,
            idempotency_key=f"agent:{ctx.idempotency_key}",
            metadata={"parent_run_id": ctx.run_id, "parent_step_id": ctx.step_id, "agent_skill": skill.id},
            chain_remaining=remaining - 1,
        )
        now = runs.store.clock.now()
        # The idempotency key makes a re-run of this step find its child instead of starting a second one.
        child, created = runs.store.create_run(NewRun(
            tenant_id=request.tenant_id, user_id=request.user_id, session_id=request.session_id,
            request=request.model_dump(mode="json"), idempotency_key=request.idempotency_key,
            parent_run_id=ctx.run_id, deadline_at=now + call.timeout,
        ))
        call.info["child_run_id"] = child.run_id
        detail = {"parent_run_id": ctx.run_id, "parent_step_id": ctx.step_id, "skill": skill.id}
        if created:
            runs.store.audit(child.run_id, "agent_invoked", "tool_controller",
                             {**detail, "deadline_s": round(call.timeout, 3)})
        elif child.parent_run_id != ctx.run_id:
            raise ToolCallError("agent_key_conflict", f"{skill.id}: the child Run key {request.idempotency_key} "
                                                      f"belongs to Run {child.run_id}, not a child of this Run")
        else:
            runs.store.audit(child.run_id, "agent_reattached", "tool_controller",
                             {**detail, "state": child.state.value})
        # a re-attached child keeps the time it was first given: the parent's budget does not restart
        due_in = call.timeout if child.deadline_at is None else min(call.timeout, max(0.0, child.deadline_at - now))
        waited = runs.await_child(ctx.run_id, child.run_id, time.monotonic() + due_in)
        if waited.stopped == "deadline":
            raise call.late()
        if waited.result is None:
            raise ToolCallError("superseded", f"{skill.id}: stopped waiting for child Run {child.run_id}: "
                                              f"{waited.detail}")
        return self._outcome(waited.result, skill)

    @staticmethod
    def _outcome(result: RunResult, skill: Skill) -> dict[str, Any]:
        if result.state == "SUCCEEDED":
            return {"run_id": result.run_id, "answer": result.answer, "artifacts": result.artifacts}
        if result.state == "CLOSED_REJECTED":
            code = "child_run_rejected"
        elif result.state == "CLOSED_CANCELLED":
            code = "child_run_cancelled"
        else:
            code = "child_run_timeout" if "TIMEOUT" in result.path else "child_run_failed"
        raise ToolCallError(code, f"child Run {result.run_id} of {skill.id} ended {result.state}: {result.error}")

    @staticmethod
    def _chain_remaining(runs: ChildDriver, recorded: Any, parent_id: str | None) -> int:
        """The parent's delegation budget: as its request recorded it, or for a Run created before
        requests carried one, the default depth less its ancestors."""
        if isinstance(recorded, int):
            return recorded
        depth = 0
        while parent_id is not None:
            depth += 1
            parent_id = runs.store.get_run(parent_id).parent_run_id
        return runs.chain_depth - depth
