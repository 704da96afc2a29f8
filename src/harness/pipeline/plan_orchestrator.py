"""Plan orchestrator (step ④ and the schedule of step ⑥, seed 004 §3.3).

Asks the LLM provider for a Plan, validates it (an invalid plan is a PlanError, never a crash),
falls back to the listed order when the dependency graph is not a DAG (P2), and executes the plan:
steps whose dependencies are done run concurrently; each result is recorded before any step that
depends on it starts (T6); steps exchange data only through output keys.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from harness.domain.contracts import AssembledContext, Message
from harness.domain.errors import PlanError, ProviderError
from harness.domain.llm import LLMRequest, LLMResponse, ToolSpec
from harness.domain.plans import Plan, PlanStep, lookup_path, refs_in
from harness.pipeline import waits
from harness.pipeline.tool_kinds import complete
from harness.pipeline.waits import Lane
from harness.ports import LLMProvider
from harness.skills.manifests import SkillRegistry


@dataclass(frozen=True)
class PlanOutcome:
    """A validated plan, whether its DAG had to be flattened (and why), and the call's usage."""

    plan: Plan
    flattened: bool
    dag_problem: str | None
    response: LLMResponse


def _provider_retryable(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.retryable


def dag_problem(plan: Plan) -> str | None:
    """Why the plan's dependencies do not form a usable DAG, or None when they do."""
    ids = {s.id for s in plan.steps}
    by_key = {s.output_key: s.id for s in plan.steps}
    deps = {s.id: set(s.depends_on) for s in plan.steps}
    for step in plan.steps:
        unknown = set(step.depends_on) - ids
        if unknown:
            return f"step {step.id} depends on unknown step(s) {sorted(unknown)}"
        if step.id in step.depends_on:
            return f"step {step.id} depends on itself"
    visiting: set[str] = set()
    done: set[str] = set()

    def cyclic(node: str) -> bool:
        if node in done:
            return False
        if node in visiting:
            return True
        visiting.add(node)
        found = any(cyclic(d) for d in deps[node])
        visiting.discard(node)
        done.add(node)
        return found

    for sid in ids:
        if cyclic(sid):
            return f"dependencies contain a cycle through step {sid}"
    for step in plan.steps:
        for ref in refs_in(step.tool_call.arguments):
            producer = by_key.get(ref.split(".", 1)[0])
            if producer is not None and producer not in upstream(plan, step.id):
                return f"step {step.id} reads {ref!r} from step {producer}, which it does not depend on"
    return None


def upstream(plan: Plan, step_id: str) -> set[str]:
    """Every step that `step_id` depends on, directly or not."""
    deps = {s.id: s.depends_on for s in plan.steps}
    seen: set[str] = set()
    stack = list(deps.get(step_id, ()))
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(deps.get(current, ()))
    return seen


def generations(plan: Plan, flattened: bool) -> list[list[PlanStep]]:
    """The steps grouped into waves that may run concurrently; one step a wave when flattened."""
    if flattened:
        return [[s] for s in plan.steps]
    remaining = list(plan.steps)
    done: set[str] = set()
    waves: list[list[PlanStep]] = []
    while remaining:
        wave = [s for s in remaining if set(s.depends_on) <= done]
        waves.append(wave)
        done.update(s.id for s in wave)
        remaining = [s for s in remaining if s.id not in done]
    return waves


def resolve(value: Any, outputs: dict[str, Any]) -> Any:
    """Replace every `{"$ref": "key.field"}` with the referenced output."""
    if isinstance(value, dict):
        if set(value) == {"$ref"} and isinstance(value["$ref"], str):
            return lookup_path(outputs, value["$ref"])
        return {k: resolve(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, outputs) for v in value]
    return value


class PlanOrchestrator:
    """Gets a valid plan from the model and drives its execution."""

    def __init__(self, provider: LLMProvider, registry: SkillRegistry, *, max_attempts: int = 3,
                 max_parallel: int = 4, lane: Lane | None = None) -> None:
        self.provider = provider
        #: where a model call of a provider that cannot wait without a thread runs (the tool controller's
        #: model lane); a provider with asynchronous I/O waits in the drive, switched out
        self.lane = lane or Lane("llm", 32)
        self.registry = registry
        self.max_attempts = max_attempts
        self.max_parallel = max_parallel
        # one pool for the life of the orchestrator: creating threads per Run cost more than the steps
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="plan-step")

    def plan(self, context: AssembledContext, tools: Sequence[ToolSpec], *, rounds: Sequence[Message] = (),
             taken: tuple[set[str], set[str]] = (set(), set()),
             failures: list[ProviderError] | None = None,
             fit: Callable[[LLMRequest], LLMRequest] | None = None) -> PlanOutcome:
        """Ask the model for a plan and validate it; PlanError names what is wrong.

        For a later round, `rounds` is the conversation of the completed rounds (each plan and its
        results) and `taken` the step ids and output keys they used, which the new plan may not reuse
        (its steps may read the earlier outputs). Each attempt the provider failed (retried or the last)
        is appended to `failures`, so that the caller can record every one. `fit` checks the request
        against the budget before the call (harness.pipeline.call_budget): it may ask for fewer output
        tokens, or refuse with BudgetExceededError."""
        request = LLMRequest(
            purpose="plan", system=context.system_prompt,
            messages=(*context.history, Message(role="user", content=context.user_input), *rounds),
            tools=tuple(tools), max_tokens=max(256, min(4_096, context.budget_left)),
        )
        if fit is not None:
            request = fit(request)
        response: LLMResponse | None = None
        for attempt in Retrying(stop=stop_after_attempt(self.max_attempts),
                                wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
                                retry=retry_if_exception(_provider_retryable), reraise=True, sleep=waits.sleep):
            with attempt:
                try:
                    response = complete(self.provider, request, self.lane)
                except ProviderError as exc:
                    if failures is not None:
                        failures.append(exc)
                    raise
        assert response is not None
        try:
            plan = self.parse(response.content, {t.name for t in tools}, taken)
        except PlanError as exc:
            exc.response = response  # the tokens were spent even though the plan is unusable
            raise
        problem = dag_problem(plan)
        return PlanOutcome(plan, problem is not None, problem, response)

    def parse(self, content: str, visible: set[str], taken: tuple[set[str], set[str]] = (set(), set())) -> Plan:
        """A Plan from the model's text, or PlanError explaining why it is not one. `taken`: the step ids
        and output keys of the Run's earlier rounds."""
        try:
            raw = json.loads(_strip_fences(content))
        except json.JSONDecodeError as exc:
            raise PlanError(f"the model's answer is not a JSON plan ({exc.msg} at char {exc.pos}): "
                            f"{content[:120]!r}") from exc
        try:
            plan = Plan.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            raise PlanError(f"the model's plan is invalid at {where}: {err['msg']}") from exc
        taken_ids, taken_keys = taken
        keys = {s.output_key for s in plan.steps} | taken_keys
        for step in plan.steps:
            if step.id in taken_ids:
                raise PlanError(f"step id {step.id!r} was used in an earlier round; every step of a Run needs "
                                "its own id")
            if step.output_key in taken_keys:
                raise PlanError(f"output key {step.output_key!r} was used in an earlier round; every output "
                                "of a Run needs its own key")
            if self.registry.get(step.tool_call.skill) is None:
                raise PlanError(f"step {step.id} calls {step.tool_call.skill!r}, which is not a known skill")
            for ref in refs_in(step.tool_call.arguments):
                if ref.split(".", 1)[0] not in keys:
                    raise PlanError(f"step {step.id} references {ref!r}, which no step produces")
        del visible  # permission is the gatekeeper's decision, not a validity question
        return plan

    def execute(
        self,
        plan: Plan,
        flattened: bool,
        outputs: dict[str, Any],
        run_step: Callable[[PlanStep, dict[str, Any]], StepRun],
        before_parallel: Callable[[], None] | None = None,
    ) -> ExecutionReport:
        """Run every step not yet done, wave by wave; stop at the first failure.

        `outputs` holds results of steps already completed (after a resume) and is filled in as steps
        finish. `run_step(step, outputs_so_far)` performs and records one step.
        """
        report = ExecutionReport()
        done_keys = set(outputs)
        for wave in generations(plan, flattened):
            todo = [s for s in wave if s.output_key not in done_keys]
            snapshot = dict(outputs)
            if len(todo) == 1:
                results = [run_step(todo[0], snapshot)]  # nothing to overlap with: no thread hop
            else:
                if before_parallel is not None:  # the steps write from other threads: commit first
                    before_parallel()
                # each step runs in a copy of the drive's context (its lease and RunContext): on a drive loop
                # in a greenlet of its own, elsewhere on a pool thread; the drive waits for all of them
                results = waits.run_all([functools.partial(run_step, s, snapshot) for s in todo], self._pool)
            for result in results:
                report.runs.append(result)
                if result.ok:
                    outputs[result.output_key] = result.output
                    done_keys.add(result.output_key)
            failed = [r for r in report.runs if not r.ok]
            if failed:
                report.failure = failed[0]
                return report
        return report


@dataclass
class StepRun:
    """How one step went, as the run manager recorded it."""

    step_id: str
    output_key: str
    ok: bool
    output: Any = None
    error: str | None = None
    error_code: str | None = None


@dataclass
class ExecutionReport:
    """Every step that ran, and the first failure if there was one."""

    runs: list[StepRun] = field(default_factory=list)
    failure: StepRun | None = None


def _strip_fences(content: str) -> str:
    text = content.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0]
    return text
