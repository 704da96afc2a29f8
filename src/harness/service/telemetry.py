"""OpenTelemetry spans (SPEC U4) for every pipeline step, LLM call and tool call, as layers around the
kernel rather than edits inside it: a state machine listener opens and closes one span per step (a
state is a step), and thin wrappers around the tool controller and the LLM provider add their spans.

A Run's trace id *is* its run id (a UUID is 128 bits), and its root span id is derived from it, so the
spans written by every process that touches the Run — the one that planned it, the one that resumed
it after an approval — land in one trace. The root span itself ("invoke_agent harness") is written by
whichever process closes the Run, covering created_at to the final state. Attribute names follow the
GenAI semantic conventions where they apply (gen_ai.operation.name, gen_ai.provider.name / gen_ai.system,
gen_ai.request.model, gen_ai.usage.*, gen_ai.tool.name).
"""

from __future__ import annotations

import contextvars
import hashlib
import threading
import uuid
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, StatusCode, TraceFlags

from harness.config import Runtime
from harness.domain.errors import InvalidRequestError, ProviderError
from harness.domain.llm import LLMRequest, LLMResponse
from harness.kernel.states import FINAL, RunState
from harness.pipeline.tool_controller import CallResult
from harness.ports import LLMProvider
from harness.skills.manifests import Skill

S = RunState
#: the pipeline step each state is (seed 004 ch. 2): the span covers the time the Run spent in it
STEP_OF_STATE = {
    S.CREATED: "create_run",
    S.PREPARING: "assemble_context",
    S.PLANNING: "plan",
    S.POLICY_CHECK: "policy",
    S.AWAITING_HITL: "hitl",
    S.EXECUTING: "tools",
    S.TRACING: "trace",
}
_FAILED_FINALS = {S.CLOSED_FAILED}


def run_trace_id(run_id: str) -> int:
    """The trace id of a Run: its UUID, or a hash of any other id."""
    try:
        return uuid.UUID(run_id).int
    except ValueError:
        return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big")


def run_root_span_id(run_id: str) -> int:
    """The span id of a Run's root span, derived so every process agrees on it."""
    return int.from_bytes(hashlib.sha256(f"root:{run_id}".encode()).digest()[:8], "big") or 1


class _RunIdGenerator(RandomIdGenerator):
    """Random ids, except while a Run's root span is being created (then its derived ids)."""

    def __init__(self) -> None:
        self.forced = threading.local()

    def generate_trace_id(self) -> int:
        """The forced trace id, or a random one."""
        ids = getattr(self.forced, "ids", None)
        return ids[0] if ids else super().generate_trace_id()

    def generate_span_id(self) -> int:
        """The forced span id, or a random one."""
        ids = getattr(self.forced, "ids", None)
        return ids[1] if ids else super().generate_span_id()


def exporter_for(name: str) -> SpanExporter | None:
    """The span exporter a setting names: none, console, or otlp (needs the OTLP exporter package)."""
    if name == "none":
        return None
    if name == "console":
        return ConsoleSpanExporter()
    try:
        # optional package: only a deployment that exports over OTLP installs it
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )
    except ImportError as exc:
        raise InvalidRequestError(
            "otel exporter 'otlp' needs the otlp extra: pip install 'harness-kernel[otlp]'"
        ) from exc
    exporter: SpanExporter = OTLPSpanExporter()
    return exporter


class Telemetry:
    """Turns a Runtime's activity into spans."""

    def __init__(
        self, exporter: SpanExporter, *, batch: bool = False, service_name: str = "harness-kernel"
    ) -> None:
        self._ids = _RunIdGenerator()
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": service_name}), id_generator=self._ids
        )
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("harness")
        self._lock = threading.Lock()
        self._steps: dict[str, Span] = {}
        self._runtime: Runtime | None = None
        #: the Run this drive last moved: the pipeline calls the LLM in the drive that entered PLANNING (a
        #: context variable, not a thread's: on a drive loop many drives share one thread)
        self._moved: contextvars.ContextVar[str | None] = contextvars.ContextVar("harness_otel_run", default=None)

    @classmethod
    def from_setting(cls, name: str) -> Telemetry | None:
        """Telemetry exporting where the setting says, or None for "none"."""
        exporter = exporter_for(name)
        return cls(exporter, batch=name == "otlp") if exporter is not None else None

    def instrument(self, runtime: Runtime) -> None:
        """Listen to the runtime's state machine and wrap its tool controller and LLM provider."""
        self._runtime = runtime
        runtime.machine.subscribe(self.on_transition, at_commit=False)  # each step's span ends as it does
        tools = runtime.runs.tools
        setattr(tools, "call", self._traced_call(tools.call))  # noqa: B010 - an instance-level layer
        orchestrator = runtime.runs.orchestrator
        orchestrator.provider = TracedProvider(orchestrator.provider, self)

    def shutdown(self) -> None:
        """End open spans and flush the exporter."""
        with self._lock:
            spans, self._steps = list(self._steps.values()), {}
        for span in spans:
            span.end()
        self.provider.shutdown()

    # ------------------------------------------------------------------ contexts

    @staticmethod
    def root_context(run_id: str) -> Context:
        """A context whose parent is the Run's (possibly remote) root span."""
        parent = SpanContext(
            trace_id=run_trace_id(run_id),
            span_id=run_root_span_id(run_id),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        return trace.set_span_in_context(NonRecordingSpan(parent))

    def current_context(self) -> Context | None:
        """The step context of the Run this thread is driving, if any."""
        run_id = self._moved.get()
        return self.step_context(run_id) if run_id else None

    def step_context(self, run_id: str) -> Context:
        """A context whose parent is the Run's current step span in this process, else its root."""
        with self._lock:
            span = self._steps.get(run_id)
        return trace.set_span_in_context(span) if span is not None else self.root_context(run_id)

    # ------------------------------------------------------------------ steps

    def on_transition(self, run_id: str, source: RunState, target: RunState) -> None:
        """State machine listener: end the step just left, open the one entered, close the Run at the end."""
        self._moved.set(run_id)
        with self._lock:
            previous = self._steps.pop(run_id, None)
        if previous is not None:
            previous.set_attribute("harness.next_state", target.value)
            previous.end()
        elif source == S.CREATED:
            self._created_span(run_id, target)
        step = STEP_OF_STATE.get(target)
        if step is not None:
            span = self.tracer.start_span(
                f"harness.step {step}",
                context=self.root_context(run_id),
                attributes={
                    "harness.run_id": run_id,
                    "harness.step": step,
                    "harness.state": target.value,
                    "harness.previous_state": source.value,
                },
            )
            with self._lock:
                self._steps[run_id] = span
        if target in FINAL:
            self._root_span(run_id, target)

    def _created_span(self, run_id: str, target: RunState) -> None:
        if self._runtime is None:
            return
        created_at = self._runtime.store.get_run(run_id).created_at
        span = self.tracer.start_span(
            "harness.step create_run",
            context=self.root_context(run_id),
            start_time=int(created_at * 1e9),
            attributes={
                "harness.run_id": run_id,
                "harness.step": "create_run",
                "harness.state": S.CREATED.value,
                "harness.next_state": target.value,
            },
        )
        span.end()

    def _root_span(self, run_id: str, final: RunState) -> None:
        if self._runtime is None:
            return
        run = self._runtime.store.get_run(run_id)
        self._ids.forced.ids = (run_trace_id(run_id), run_root_span_id(run_id))
        try:
            span = self.tracer.start_span(
                "invoke_agent harness",
                context=Context(),
                start_time=int(run.created_at * 1e9),
                kind=trace.SpanKind.INTERNAL,
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": "harness",
                    "gen_ai.conversation.id": run.session_id,
                    "harness.run_id": run_id,
                    "harness.tenant_id": run.tenant_id,
                    "harness.user_id": run.user_id,
                    "harness.final_state": final.value,
                    "harness.close_reason": run.close_reason.value if run.close_reason else "",
                },
            )
        finally:
            self._ids.forced.ids = None
        if final in _FAILED_FINALS:
            span.set_status(StatusCode.ERROR, (run.result or {}).get("error") or final.value)
        span.end()

    # ------------------------------------------------------------------ tool calls

    def _traced_call(self, call: Any) -> Any:
        # pass every argument through untouched: this layer must not care how the controller's
        # signature grows (only run_id and step_id, always keywords, are read)
        def traced(skill: Skill, *args: Any, **kwargs: Any) -> CallResult:
            run_id, step_id = str(kwargs.get("run_id", "")), str(kwargs.get("step_id", ""))
            with self.tracer.start_as_current_span(
                f"execute_tool {skill.id}",
                context=self.step_context(run_id) if run_id else None,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": skill.id,
                    "gen_ai.tool.call.id": f"{run_id}:{step_id}",
                    "gen_ai.tool.type": "function",
                    "harness.run_id": run_id,
                    "harness.plan_step": step_id,
                    "harness.skill.version": skill.manifest.version,
                },
            ) as span:
                result: CallResult = call(skill, *args, **kwargs)
                span.set_attribute("harness.tool.attempts", result.trace.attempts)
                span.set_attribute("harness.tool.status", result.trace.status)
                if result.exception is not None:
                    span.set_attribute("error.type", result.trace.error_code or "error")
                    span.set_status(StatusCode.ERROR, str(result.exception))
                return result

        return traced


class TracedProvider:
    """An LLMProvider layer that writes one GenAI "chat" span per completion."""

    def __init__(self, inner: LLMProvider, telemetry: Telemetry) -> None:
        self.inner = inner
        self.name = inner.name
        #: it waits as the provider it wraps does (harness.pipeline.tool_kinds.complete)
        self.waits_itself = bool(getattr(inner, "waits_itself", False))
        self._telemetry = telemetry

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Complete through the wrapped provider, inside a span."""
        model = request.model or self.name
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.name,
            "gen_ai.system": self.name,
            "gen_ai.request.model": model,
            "gen_ai.request.temperature": request.temperature,
            "gen_ai.request.max_tokens": request.max_tokens,
            "harness.llm.purpose": request.purpose,
        }
        if request.top_p is not None:
            attributes["gen_ai.request.top_p"] = request.top_p
        with self._telemetry.tracer.start_as_current_span(
            f"chat {model}",
            kind=trace.SpanKind.CLIENT,
            context=self._telemetry.current_context(),
            attributes=attributes,
        ) as span:
            try:
                response = self.inner.complete(request)
            except ProviderError as exc:
                span.set_attribute("error.type", exc.kind)
                span.set_status(StatusCode.ERROR, str(exc))
                raise
            span.set_attribute("gen_ai.response.model", response.model)
            span.set_attribute("gen_ai.usage.input_tokens", response.usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", response.usage.output_tokens)
            span.set_attribute("gen_ai.response.finish_reasons", [response.finish_reason])
            return response
