"""Tool controller (step ⑥, seed 004 §3.5): every side effect leaves the kernel through here.

It lists the skills a caller may see (RBAC, T2), converts their schemas into tool specs, and runs a
call: arguments validated against the manifest's schema, run by its call kind (local, sandbox, llm,
agent — T4, see tool_kinds), retried per the manifest by error class (T3) through the skill's
circuit breaker, bounded by the manifest's timeout and by what is left of the Run's execution limit
(T5), with the deterministic idempotency key (run_id, step id) handed to the skill (T6). When the
breaker is open, or the retries of a transient failure are spent, the manifest's fallback runs and
the switch is traced (ToolTrace.fallback_from). Each call yields a StepOutcome and its ToolTraces.

A sandboxed call's outcome also holds what it printed (stdout and stderr, bounded) and the files it wrote
in its working directory, kept by content hash within the artifact limits (harness.pipeline.artifacts);
their contents leave with the result (`CallResult.contents`) to be stored with it.

A skill's output, and the message of its failure, pass the secret filter (`redact`) before they leave
the call (the streams and text files too): what a Run stores (its RunContext, the blobs behind the hashes,
its result), returns, pushes and exports is the filtered output, and so is what later steps of the plan
are given. The output's schema is checked on what the skill returned, before the filter.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jsonschema
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_any,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

from harness.clock import SystemClock
from harness.domain.chain import content_hash
from harness.domain.contracts import CallerIdentity, Message, StepOutcome
from harness.domain.errors import ProviderError
from harness.domain.llm import LLMRequest, LLMResponse, ToolSpec
from harness.domain.traces import CostTrace, ToolTrace, unit_price
from harness.pipeline import waits
from harness.pipeline.artifacts import ArtifactLimits, Collector, Leftovers
from harness.pipeline.resilience import BreakerConfig, BreakerRegistry, CircuitOpenError
from harness.pipeline.sandbox_pool import SandboxPool
from harness.pipeline.tool_kinds import (
    AgentCalls,
    Attempt,
    ChildDriver,
    Lanes,
    LlmCalls,
    LocalCalls,
    RetryableSkillError,
    SandboxCalls,
    StepTimeoutError,
    ToolCallError,
    complete,
)
from harness.ports import Clock, LLMProvider, Sandbox
from harness.ports.segments import SegmentStore
from harness.ports.workdirs import Workdirs
from harness.skills.manifests import Skill, SkillContext, SkillRegistry

__all__ = ["CallResult", "ToolController", "error_code", "is_retryable"]


def is_retryable(exc: BaseException) -> bool:
    """SPEC T3: network errors, 5xx and 429 are retried; everything else fails at once."""
    if isinstance(exc, ProviderError | ToolCallError):
        return exc.retryable
    return isinstance(exc, RetryableSkillError | ConnectionError | socket.timeout)


def error_code(exc: BaseException) -> str:
    """A stable code for an error, for ToolTrace and ErrorTrace."""
    if isinstance(exc, StepTimeoutError):
        return "run_time_limit" if exc.limit == "run" else "timeout"
    if isinstance(exc, jsonschema.ValidationError):
        return "invalid_arguments"
    if isinstance(exc, ProviderError):
        return exc.kind
    if isinstance(exc, ToolCallError):
        return exc.code
    if isinstance(exc, CircuitOpenError):
        return "circuit_open"
    return type(exc).__name__


def counts_against(exc: BaseException) -> bool:
    """Whether a failure says the skill itself is unwell (what its breaker counts): transient errors,
    its own timeouts and sandbox crashes — not bad arguments, business errors or the Run's own limit."""
    if isinstance(exc, StepTimeoutError):
        return exc.limit == "step"
    if isinstance(exc, ToolCallError) and exc.code in ("sandbox_crashed", "sandbox_killed"):
        return True
    return is_retryable(exc)


@dataclass(frozen=True)
class CallResult:
    """What one call produced: the recorded outcome, its final ToolTrace and every ToolTrace (the
    primary's before a fallback's), and the contents of the files it kept, to be stored with it."""

    outcome: StepOutcome
    trace: ToolTrace
    exception: BaseException | None = None
    traces: tuple[ToolTrace, ...] = ()
    contents: tuple[Any, ...] = ()


@dataclass
class _Go:
    """One skill's go at a call, retries included."""

    skill: Skill
    output: Any = None
    failure: BaseException | None = None
    runs: int = 0
    duration_ms: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


PermissionCheck = Callable[[CallerIdentity, Skill], bool]
Executor = Callable[[Attempt], Any]


class ToolController:
    """Runs skill calls for Runs."""

    def __init__(self, registry: SkillRegistry, *, workdirs: Workdirs, lanes: Lanes | None = None,
                 sandbox: Sandbox | None = None, choose_sandbox: Callable[[], Sandbox] | None = None,
                 clock: Clock | None = None, breakers: BreakerRegistry | None = None,
                 provider: LLMProvider | None = None,
                 record_cost: Callable[[CostTrace], None] | None = None,
                 scrub: Callable[[str], str] | None = None, redact: Callable[[Any], Any] | None = None,
                 sandbox_price: float = 0.0,
                 price_table: str | None = None, data_dir: Path | None = None,
                 sandbox_pool: SandboxPool | None = None, kinds: Mapping[str, Executor] | None = None,
                 artifact_limits: ArtifactLimits | None = None, stream_bytes: int = 16_384,
                 artifact_store: SegmentStore | None = None) -> None:
        self.registry = registry
        self.workdirs = workdirs
        #: handed to skills (SkillContext.data_dir): the folder the working directories are in, by default
        self.data_dir = data_dir or self.workdirs.root.parent
        self.breakers = breakers or BreakerRegistry(clock or SystemClock())
        self.provider = provider
        self.record_cost = record_cost
        self.scrub = scrub
        #: filters a skill's output for secrets (JSON in, JSON out); None: outputs are kept as returned
        self.redact = redact
        #: set by the composition root once the Run manager exists (it needs this controller first)
        self.child_runs: ChildDriver | None = None
        self._sandbox = sandbox
        #: picks the sandbox at the first sandboxed call (the composition root's choice by settings)
        self._choose_sandbox = choose_sandbox
        self._sandbox_lock = threading.Lock()
        self.sandbox_pool = sandbox_pool
        #: a lane of threads per kind of call, so that none starves another (harness.pipeline.waits)
        self.lanes = lanes or Lanes.sized()
        self._kinds: dict[str, Executor] = {
            "local": LocalCalls(self.lanes.local),
            "sandbox": SandboxCalls(self.sandbox, self.workdirs, record_cost, sandbox_price, price_table,
                                    sandbox_pool, self.lanes.sandbox,
                                    collector=Collector(self.workdirs, artifact_limits, scrub, artifact_store),
                                    stream_bytes=stream_bytes),
            "llm": LlmCalls(lambda: self.provider, self.lanes.llm, record_cost, scrub),
            "agent": AgentCalls(lambda: self.child_runs),
            **(kinds or {}),  # e.g. "mcp": tools of MCP servers (harness.skills.mcp)
        }

    @property
    def workdir_root(self) -> Path:
        """Where the Runs' private working directories live."""
        return self.workdirs.root

    def sandbox(self) -> Sandbox:
        """The sandbox, chosen at the first sandboxed call (probing bubblewrap costs a process start)."""
        with self._sandbox_lock:
            if self._sandbox is None:
                if self._choose_sandbox is None:
                    raise ToolCallError("sandbox_unavailable", "no sandbox is configured for sandboxed skills")
                self._sandbox = self._choose_sandbox()
            return self._sandbox

    def visible_skills(self, caller: CallerIdentity, may_call: PermissionCheck) -> list[Skill]:
        """The skills this caller may use, by the gatekeeper's permission rules (T2)."""
        return [s for s in self.registry.all() if may_call(caller, s)]

    @staticmethod
    def tool_specs(skills: Sequence[Skill]) -> list[ToolSpec]:
        """The skills as provider-neutral tool specs."""
        return [s.tool_spec for s in skills]

    def release(self, run_id: str) -> bool:
        """Remove the Run's working directory (when it reached its final state); False if it had none."""
        return self.workdirs.remove(run_id)

    def prune(self, final_among: Callable[[Sequence[str]], set[str]], limit: int = 1_000) -> list[str]:
        """Remove the working directories of Runs that are final: those closed by another process (a
        sweeper elsewhere), whose close this process's listener never saw. Returns the Runs pruned."""
        if self.sandbox_pool is not None:  # instances of Runs closed elsewhere, and dead ones
            self.sandbox_pool.reclaim(final_among)
        done = final_among(self.workdirs.run_ids(limit))
        return sorted(run_id for run_id in done if self.workdirs.remove(run_id))

    def call(
        self,
        skill: Skill,
        arguments: dict[str, Any],
        *,
        run_id: str,
        step_id: str,
        output_key: str,
        caller: CallerIdentity,
        deadline: float | None = None,
        may_fall_back: Callable[[Skill], bool] | None = None,
    ) -> CallResult:
        """Validate, run with retries, breaker and timeout, fall back if needed, and describe what happened.

        `deadline` is the time.monotonic() by which the Run's execution limit ends; it caps the call.
        `may_fall_back(skill)` says whether this Run may use a fallback skill (default: yes).
        """
        key = f"{run_id}:{step_id}"
        ctx = SkillContext(run_id=run_id, step_id=step_id, idempotency_key=key, tenant_id=caller.tenant_id,
                           user_id=caller.user_id, workdir=self.workdirs.path(run_id), data_dir=self.data_dir)
        attempts = [self._attempt(skill, arguments, ctx, caller, deadline)]
        fallback = self._fallback_for(skill, attempts[0].failure, may_fall_back)
        if fallback is not None:
            attempts.append(self._attempt(fallback, arguments, ctx, caller, deadline))
        origin = [None, skill.id]  # the fallback's trace names the skill it stands in for
        traces = tuple(self._trace(go, ctx, arguments, origin[i]) for i, go in enumerate(attempts))
        final = attempts[-1]
        failure = final.failure
        left: Leftovers = final.info.get("leftovers") or Leftovers()
        outcome = StepOutcome(
            step_id=step_id, output_key=output_key, status="ok" if failure is None else "error",
            output=final.output if failure is None else None,
            error=None if failure is None else self.failure_text(failure),
            attempts=max(sum(go.runs for go in attempts), 1),
            duration_ms=round(sum(go.duration_ms for go in attempts), 3),
            stdout=left.stdout, stderr=left.stderr, files=tuple(left.files), skipped_files=tuple(left.skipped),
        )
        return CallResult(outcome, traces[-1], failure, traces, tuple(left.contents))

    def failure_text(self, failure: BaseException) -> str:
        """What a failed call's outcome says: its code and message, the message filtered for secrets."""
        message = str(failure)
        if self.scrub is not None and message:
            try:
                message = self.scrub(message)
            except Exception:  # a message that cannot be filtered is not kept
                message = "(message withheld: the secret filter failed on it)"
        return f"{error_code(failure)}: {message}"

    def compose_answer(self, system: str, messages: Sequence[Message], *, run_id: str, caller: CallerIdentity,
                       deadline: float | None = None, max_attempts: int = 3,
                       fit: Callable[[LLMRequest], LLMRequest] | None = None) -> LLMResponse:
        """The final answer of a Run written by the model from its results: one completion (purpose
        "answer") with every message filtered for secrets (C4), retried on transient errors (T3), bounded
        by what is left of the Run's execution limit (T5) and recorded as a cost. Raises ProviderError,
        StepTimeoutError, or ContextError when the secret filter fails."""
        provider = self.provider
        if provider is None:
            raise ToolCallError("llm_unavailable", "writing the answer needs an LLM provider; the Runtime has none")
        if self.scrub is not None:
            scrub = self.scrub
            system = scrub(system)
            messages = [Message(role=m.role, content=scrub(m.content)) for m in messages]
        request = LLMRequest(purpose="answer", system=system, messages=tuple(messages), max_tokens=1_024)
        if fit is not None:  # the budget's check before the call (harness.pipeline.call_budget)
            request = fit(request)
        response: LLMResponse | None = None
        for attempt in Retrying(stop=stop_any(stop_after_attempt(max_attempts), _Past(deadline)),
                                wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
                                retry=retry_if_exception(is_retryable), reraise=True, sleep=waits.sleep):
            with attempt:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise StepTimeoutError("the answer was not written: the Run's execution limit passed", "run")
                try:
                    response = complete(provider, request, self.lanes.llm, remaining)
                except TimeoutError as exc:
                    raise StepTimeoutError("writing the answer ran past the Run's execution limit", "run") from exc
        assert response is not None
        if self.record_cost is not None:
            usage = response.usage
            self.record_cost(CostTrace(run_id=run_id, source=f"llm:{response.provider}:answer",
                                       input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                                       api_calls=1, usd=usage.cost_usd, unit_price=unit_price(usage),
                                       priced=usage.priced, model=response.model, tenant_id=caller.tenant_id,
                                       user_id=caller.user_id))
        return response

    def _fallback_for(self, skill: Skill, failure: BaseException | None,
                      may_fall_back: Callable[[Skill], bool] | None) -> Skill | None:
        if failure is None or skill.manifest.fallback is None:
            return None
        if not (isinstance(failure, CircuitOpenError) or is_retryable(failure)):
            return None  # a definite answer (bad input, business error) is not the dependency being sick
        fallback = self.registry.get(skill.manifest.fallback)
        if fallback is None or (may_fall_back is not None and not may_fall_back(fallback)):
            return None
        return fallback

    def _attempt(self, skill: Skill, arguments: dict[str, Any], ctx: SkillContext, caller: CallerIdentity,
                 deadline: float | None) -> _Go:
        go = _Go(skill)
        started = time.perf_counter()
        settings = skill.manifest.breaker
        breaker = self.breakers.get(f"skill:{skill.id}", BreakerConfig(
            failure_threshold=settings.failure_threshold, reset_timeout=settings.reset_timeout_s))
        run = self._kinds[skill.manifest.call_kind]

        def once() -> Any:
            go.runs += 1
            timeout, limit = self._budget(skill, deadline)
            return run(Attempt(skill, arguments, ctx, caller, timeout, limit, go.info, run_deadline=deadline))

        stop = stop_any(stop_after_attempt(skill.manifest.retry.max_attempts), _Past(deadline))
        try:
            skill.validate_arguments(arguments)
            for retry in Retrying(stop=stop, wait=_backoff(skill), retry=retry_if_exception(is_retryable),
                                  reraise=True, sleep=waits.sleep):
                with retry:
                    go.output = breaker.call(once, counts=counts_against)
            problem = skill.output_problem(go.output)
            if problem is not None:  # a definite answer that breaks the skill's contract: not retried
                raise ToolCallError("invalid_output", f"{skill.id} returned an output that does not fit its "
                                                      f"output_schema: {problem}")
            if self.redact is not None:
                go.output = self._redacted(skill, go.output)
        except Exception as exc:  # a skill's failure fails its step, never the process
            go.failure = exc
        go.duration_ms = (time.perf_counter() - started) * 1000
        return go

    def _redacted(self, skill: Skill, output: Any) -> Any:
        """The output with its secrets replaced; a filter that fails fails the call (nothing is kept)."""
        assert self.redact is not None
        try:
            return self.redact(output)
        except Exception as exc:
            raise ToolCallError("secret_filter_failed", f"{skill.id}'s output could not be filtered for secrets: "
                                                        f"{type(exc).__name__}") from exc

    @staticmethod
    def _budget(skill: Skill, deadline: float | None) -> tuple[float, Literal["step", "run"]]:
        """Seconds this attempt may take, and which limit that is: the manifest's, or the Run's rest."""
        timeout = skill.manifest.timeout_s
        if deadline is None:
            return timeout, "step"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StepTimeoutError(f"{skill.id} was not started: the Run's execution limit passed", "run")
        return (remaining, "run") if remaining < timeout else (timeout, "step")

    @staticmethod
    def _trace(go: _Go, ctx: SkillContext, arguments: dict[str, Any], fallback_from: str | None) -> ToolTrace:
        skill, failure = go.skill, go.failure
        refused = isinstance(failure, CircuitOpenError) and go.runs == 0
        left: Leftovers | None = go.info.get("leftovers")
        return ToolTrace(
            run_id=ctx.run_id, step_id=ctx.step_id, skill_id=skill.id, skill_version=skill.manifest.version,
            manifest_hash=skill.manifest_hash, call_kind=skill.manifest.call_kind,
            isolation=go.info.get("isolation"), sandbox_provider=go.info.get("sandbox_provider"),
            child_run_id=go.info.get("child_run_id"),
            files=tuple(f.content_hash for f in left.files) if left is not None and left.files else None,
            idempotency_key=ctx.idempotency_key, arguments_hash=content_hash(arguments),
            result_hash=content_hash(go.output) if failure is None else None, attempts=go.runs,
            duration_ms=round(go.duration_ms, 3),
            status="ok" if failure is None else "refused" if refused else "error",
            error_code=None if failure is None else error_code(failure), fallback_from=fallback_from,
            idempotent=skill.manifest.idempotent,
        )

    def close(self) -> None:
        """Stop the worker threads."""
        self.lanes.close()


class _Past(stop_base):
    """Stop retrying when the next attempt would start after the Run's deadline."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def __call__(self, retry_state: RetryCallState) -> bool:
        wake = time.monotonic() + (retry_state.upcoming_sleep or 0.0)
        return self.deadline is not None and wake >= self.deadline


def _backoff(skill: Skill) -> Any:
    policy = skill.manifest.retry
    return wait_exponential_jitter(multiplier=policy.backoff_s, max=policy.max_backoff_s,
                                   jitter=policy.backoff_s)
