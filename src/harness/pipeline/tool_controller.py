"""Tool controller (step ⑥, seed 004 §3.5): every side effect leaves the kernel through here.

It lists the skills a caller may see (RBAC, T2), converts their schemas into tool specs, and runs a
call: arguments validated against the manifest's schema, retried per the manifest by error class
(T3), bounded by the manifest's timeout, with the deterministic idempotency key (run_id, step id)
handed to the skill (T6). Each call yields a StepOutcome and a ToolTrace.
"""

from __future__ import annotations

import concurrent.futures
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from harness.adapters.llm.types import ToolSpec
from harness.audit.chain import content_hash
from harness.errors import ProviderError
from harness.pipeline.contracts import CallerIdentity, StepOutcome
from harness.pipeline.trace_recorder import ToolTrace
from harness.skills import Skill, SkillContext, SkillRegistry


class RetryableSkillError(Exception):
    """Raised by a skill for a transient failure that is worth retrying (like a 5xx or a 429)."""


class StepTimeoutError(Exception):
    """A call ran past its manifest's timeout."""


def is_retryable(exc: BaseException) -> bool:
    """SPEC T3: network errors, 5xx and 429 are retried; everything else fails at once."""
    if isinstance(exc, ProviderError):
        return exc.retryable
    return isinstance(exc, RetryableSkillError | ConnectionError | socket.timeout)


def error_code(exc: BaseException) -> str:
    """A stable code for an error, for ToolTrace and ErrorTrace."""
    if isinstance(exc, StepTimeoutError):
        return "timeout"
    if isinstance(exc, jsonschema.ValidationError):
        return "invalid_arguments"
    if isinstance(exc, ProviderError):
        return exc.kind
    return type(exc).__name__


@dataclass(frozen=True)
class CallResult:
    """What one call produced: the recorded outcome and its ToolTrace."""

    outcome: StepOutcome
    trace: ToolTrace
    exception: BaseException | None = None


PermissionCheck = Callable[[CallerIdentity, Skill], bool]


class ToolController:
    """Runs skill calls for Runs."""

    def __init__(self, registry: SkillRegistry, *, workdir_root: Path | None = None, max_workers: int = 8) -> None:
        self.registry = registry
        self.workdir_root = workdir_root or Path("harness-data") / "runs"
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="skill")

    def visible_skills(self, caller: CallerIdentity, may_call: PermissionCheck) -> list[Skill]:
        """The skills this caller may use, by the gatekeeper's permission rules (T2)."""
        return [s for s in self.registry.all() if may_call(caller, s)]

    @staticmethod
    def tool_specs(skills: Sequence[Skill]) -> list[ToolSpec]:
        """The skills as provider-neutral tool specs."""
        return [ToolSpec(name=s.id, description=s.manifest.description, parameters=s.manifest.input_schema)
                for s in skills]

    def call(
        self,
        skill: Skill,
        arguments: dict[str, Any],
        *,
        run_id: str,
        step_id: str,
        output_key: str,
        caller: CallerIdentity,
    ) -> CallResult:
        """Validate, run with retries and timeout, and describe what happened."""
        key = f"{run_id}:{step_id}"
        ctx = SkillContext(run_id=run_id, step_id=step_id, idempotency_key=key, tenant_id=caller.tenant_id,
                           user_id=caller.user_id, workdir=self.workdir_root / run_id)
        attempts = 0
        started = time.perf_counter()

        def count_attempt(state: RetryCallState) -> None:
            nonlocal attempts
            attempts = state.attempt_number

        policy = skill.manifest.retry
        output: Any = None
        failure: BaseException | None = None
        try:
            skill.validate_arguments(arguments)
            for attempt in Retrying(
                stop=stop_after_attempt(policy.max_attempts),
                wait=wait_exponential_jitter(multiplier=policy.backoff_s, max=policy.max_backoff_s,
                                            jitter=policy.backoff_s),
                retry=retry_if_exception(is_retryable),
                before=count_attempt,
                reraise=True,
            ):
                with attempt:
                    output = self._run_once(skill, arguments, ctx)
        except Exception as exc:  # a skill's failure fails its step, never the process
            failure = exc
        duration = (time.perf_counter() - started) * 1000
        status = "ok" if failure is None else "error"
        outcome = StepOutcome(
            step_id=step_id, output_key=output_key, status=status, output=output if failure is None else None,
            error=None if failure is None else f"{error_code(failure)}: {failure}", attempts=max(attempts, 1),
            duration_ms=round(duration, 3),
        )
        trace = ToolTrace(
            run_id=run_id, step_id=step_id, skill_id=skill.id, skill_version=skill.manifest.version,
            manifest_hash=skill.manifest_hash, idempotency_key=key, arguments_hash=content_hash(arguments),
            result_hash=content_hash(output) if failure is None else None, attempts=outcome.attempts,
            duration_ms=outcome.duration_ms, status=status,
            error_code=None if failure is None else error_code(failure),
        )
        return CallResult(outcome, trace, failure)

    def _run_once(self, skill: Skill, arguments: dict[str, Any], ctx: SkillContext) -> Any:
        future = self._pool.submit(skill.fn, dict(arguments), ctx)
        try:
            return future.result(timeout=skill.manifest.timeout_s)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise StepTimeoutError(f"{skill.id} ran longer than {skill.manifest.timeout_s}s") from exc

    def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)
