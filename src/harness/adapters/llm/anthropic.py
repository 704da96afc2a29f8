"""An Anthropic messages provider, on the official `anthropic` SDK (SPEC P3).

The SDK's own retries are off (max_retries=0) and its OpenTelemetry spans too: retries, the breaker
per model and the fallback model are ours (GuardedProvider), and so is tracing. SDK errors are
translated here, at the edge, into ProviderError.

The messages API takes the system prompt apart from the turns and knows only "user" and
"assistant" turns, so history "system" messages join the system prompt and "tool" messages become
user text. Planning works as in the OpenAI provider: plan_mode "json" sends the skills with
tool_choice "none" and reads the plan from the text; plan_mode "tool" forces `submit_plan`.
The API version this SDK speaks takes no sampling parameters, so LLMRequest.temperature and top_p (and the
HARNESS_LLM_TOP_P setting) are not sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import anthropic
from anthropic.types import Message, RawMessageStreamEvent

from harness.adapters.llm.resilient import GuardedProvider, ProviderSettings, status_error
from harness.adapters.llm.tool_formats import (
    SUBMIT_PLAN,
    ToolNames,
    malformed,
    submit_plan_spec,
    to_anthropic,
)
from harness.domain.errors import ProviderError
from harness.domain.llm import LLMRequest, LLMResponse
from harness.pipeline import waits
from harness.pipeline.resilience import BreakerRegistry
from harness.ports import Clock

PROVIDER = "anthropic"
_STOP = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length"}
# An error event inside a 200 stream has no HTTP status of its own; its type says which it would be.
_TYPE_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                "rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529}


def translate(exc: anthropic.AnthropicError) -> ProviderError:
    """An SDK error as a ProviderError of the right kind (SPEC T3)."""
    if isinstance(exc, anthropic.APITimeoutError):
        return ProviderError(f"{PROVIDER}: request timed out", kind="timeout", retryable=True)
    if isinstance(exc, anthropic.APIConnectionError):
        return ProviderError(f"{PROVIDER}: connection failed: {exc.__cause__ or exc}", kind="network_error",
                             retryable=True)
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code if exc.status_code >= 400 else _TYPE_STATUS.get(exc.type or "", 500)
        return status_error(PROVIDER, status, exc.api_message or exc.message, code=exc.error_code or exc.type,
                            headers=dict(exc.response.headers))
    return malformed(PROVIDER, f"{type(exc).__name__}: {exc}")


class AnthropicProvider(GuardedProvider):
    """Messages with tool use, usage and optional streaming."""

    name = PROVIDER
    #: a drive on a drive loop waits for the answer with asynchronous I/O, switched out, holding no thread
    waits_itself = True

    def __init__(self, settings: ProviderSettings, *, clock: Clock | None = None,
                 breakers: BreakerRegistry | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
        super().__init__(settings, clock=clock, breakers=breakers, **({"sleep": sleep} if sleep else {}))
        self.client = anthropic.Anthropic(api_key=settings.api_key, base_url=settings.base_url,
                                          timeout=settings.timeout_s, max_retries=0, open_telemetry=False)
        #: the asynchronous client of each drive loop
        self.async_clients = waits.PerLoop(lambda: anthropic.AsyncAnthropic(
            api_key=settings.api_key, base_url=settings.base_url, timeout=settings.timeout_s, max_retries=0,
            open_telemetry=False))

    def close(self) -> None:
        """Release the HTTP connections."""
        self.client.close()
        self.async_clients.close(lambda client: client.close())

    async def _events(self, body: dict[str, Any]) -> list[RawMessageStreamEvent]:
        stream = await self.async_clients.get().messages.create(**body)
        async with stream:
            return [event async for event in stream]

    def _attempt(self, model: str, request: LLMRequest) -> LLMResponse:
        names, body = self.body(model, request)
        try:
            if waits.suspendable():  # on a drive loop: the drive switches out until the answer is here
                if body.get("stream"):
                    return self._from_events(model, request, names, waits.wait(self._events(body)))
                answer = waits.wait(self.async_clients.get().messages.create(**body))
                if not isinstance(answer, Message):
                    raise malformed(PROVIDER, f"expected a message, got {str(answer)[:120]!r}")
                return self._from_message(model, request, names, answer)
            if body.get("stream"):
                with self.client.messages.create(**body) as stream:
                    return self._from_events(model, request, names, stream)
            message = self.client.messages.create(**body)
            if not isinstance(message, Message):
                raise malformed(PROVIDER, f"expected a message, got {str(message)[:120]!r}")
            return self._from_message(model, request, names, message)
        except anthropic.AnthropicError as exc:
            raise translate(exc) from exc
        except (AttributeError, TypeError, KeyError, ValueError) as exc:  # a body the SDK half-understood
            raise malformed(PROVIDER, f"{type(exc).__name__}: {exc}") from exc

    def body(self, model: str, request: LLMRequest) -> tuple[ToolNames, dict[str, Any]]:
        """The request body (keyword arguments of messages.create) and the tool-name table."""
        specs = list(request.tools)
        forced = request.purpose == "plan" and self.settings.plan_mode == "tool"
        if forced:
            specs.append(submit_plan_spec())
        names = ToolNames(s.name for s in specs)
        system = "\n\n".join([request.system] + [m.content for m in request.messages if m.role == "system"])
        turns = [{"role": "assistant" if m.role == "assistant" else "user",
                  "content": f"[tool output] {m.content}" if m.role == "tool" else m.content}
                 for m in request.messages if m.role != "system"]
        body: dict[str, Any] = {"model": model, "max_tokens": request.max_tokens, "messages": turns}
        if system.strip():
            body["system"] = system.strip()
        if specs:
            body["tools"] = [to_anthropic(s, names) for s in specs]
            if forced:
                body["tool_choice"] = {"type": "tool", "name": names.wire(SUBMIT_PLAN)}
            elif request.purpose == "plan":
                body["tool_choice"] = {"type": "none"}
        if request.stream or self.settings.stream:
            body["stream"] = True
        return names, body

    def _from_message(self, model: str, request: LLMRequest, names: ToolNames,
                      message: Message) -> LLMResponse:
        text: list[str] = []
        raw_calls: list[tuple[str, str, Any]] = []
        for block in message.content:
            if block.type == "text":
                text.append(block.text)
            elif block.type == "tool_use":
                raw_calls.append((block.id, block.name, block.input))
        tokens = (message.usage.input_tokens, message.usage.output_tokens)
        finish = _STOP.get(message.stop_reason or "", message.stop_reason or "stop")
        return self.response(model, request, names, content="".join(text), raw_calls=raw_calls,
                             finish=finish, served_by=str(message.model), tokens=tokens)

    def _from_events(self, model: str, request: LLMRequest, names: ToolNames,
                     events: Iterable[RawMessageStreamEvent]) -> LLMResponse:
        blocks: dict[int, dict[str, Any]] = {}
        served_by, stop, tokens_in, tokens_out = model, "stop", 0, 0
        for event in events:
            if event.type == "message_start":
                served_by, tokens_in = str(event.message.model), event.message.usage.input_tokens
            elif event.type == "content_block_start":
                block = event.content_block
                blocks[event.index] = ({"kind": "tool", "id": block.id, "name": block.name, "json": ""}
                                       if block.type == "tool_use" else {"kind": block.type, "text": ""})
            elif event.type == "content_block_delta":
                slot = blocks.setdefault(event.index, {"kind": "text", "text": ""})
                if event.delta.type == "text_delta":
                    slot["text"] = slot.get("text", "") + event.delta.text
                elif event.delta.type == "input_json_delta":
                    slot["json"] = slot.get("json", "") + event.delta.partial_json
            elif event.type == "message_delta":
                stop = _STOP.get(event.delta.stop_reason or "", event.delta.stop_reason or stop)
                tokens_out = event.usage.output_tokens
                tokens_in = event.usage.input_tokens or tokens_in
        text = "".join(b["text"] for _, b in sorted(blocks.items()) if b["kind"] == "text")
        raw_calls = [(b["id"], b["name"], _json_input(b["name"], b["json"]))
                     for _, b in sorted(blocks.items()) if b["kind"] == "tool"]
        return self.response(model, request, names, content=text, raw_calls=raw_calls, finish=stop,
                             served_by=served_by, tokens=(tokens_in, tokens_out))


def _json_input(name: str, raw: str) -> Any:
    try:
        return json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise malformed(PROVIDER, f"input of tool call {name!r} is not JSON ({exc.msg}): "
                                  f"{raw[:120]!r}") from exc
