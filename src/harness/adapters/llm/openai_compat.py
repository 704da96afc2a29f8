"""An OpenAI-compatible chat-completions provider, on the official `openai` SDK (SPEC P3).

Works with OpenAI and with servers that speak the same API (vLLM, Ollama, LiteLLM, …) through
`base_url`. The SDK's own retries are off (max_retries=0): retries, the breaker per model and the
fallback model are ours (GuardedProvider). SDK errors are translated here, at the edge, so callers
only ever see ProviderError.

Planning: the system prompt asks for a JSON plan, so in plan_mode "json" (the default) the skills
are sent as tools for their schemas with tool_choice "none" and the plan is read from the content; the
response format carries the JSON Schema of a plan over exactly those skills (`plan_format`), so a server
that constrains its output returns only plans of a valid shape. The plan is validated all the same: an
invalid one still fails the Run with the reason traced. With `tools_in_prompt` the skills are described in
the system prompt instead (a local model's chat template may not show tools). In plan_mode "tool" a
`submit_plan` tool is forced instead and its arguments become the content.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import openai
from openai import AsyncStream, Stream
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from harness.adapters.llm.resilient import GuardedProvider, ProviderSettings, status_error
from harness.adapters.llm.tool_formats import (
    SUBMIT_PLAN,
    ToolNames,
    malformed,
    plan_schema,
    submit_plan_spec,
    to_openai,
    tools_in_prompt,
)
from harness.domain.errors import ProviderError
from harness.domain.llm import LLMRequest, LLMResponse
from harness.pipeline import waits
from harness.pipeline.resilience import BreakerRegistry
from harness.ports import Clock

PROVIDER = "openai"
_PATH = "/chat/completions"


def translate(exc: openai.OpenAIError) -> ProviderError:
    """An SDK error as a ProviderError of the right kind (SPEC T3)."""
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError(f"{PROVIDER}: request timed out", kind="timeout", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        return ProviderError(f"{PROVIDER}: connection failed: {exc.__cause__ or exc}", kind="network_error",
                             retryable=True)
    if isinstance(exc, openai.APIStatusError):
        return status_error(PROVIDER, exc.status_code, _message(exc), code=exc.code,
                            headers=dict(exc.response.headers))
    if isinstance(exc, openai.APIResponseValidationError):
        return malformed(PROVIDER, str(exc))
    if isinstance(exc, openai.APIError):  # an error event inside a stream
        return ProviderError(f"{PROVIDER}: {exc.message}", kind="server_error", retryable=True)
    return malformed(PROVIDER, f"{type(exc).__name__}: {exc}")


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return exc.message


class OpenAICompatProvider(GuardedProvider):
    """Chat completions with tool calls, usage and optional streaming."""

    name = PROVIDER
    #: a drive on a drive loop waits for the answer with asynchronous I/O, switched out, holding no thread
    waits_itself = True

    def __init__(self, settings: ProviderSettings, *, clock: Clock | None = None,
                 breakers: BreakerRegistry | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
        super().__init__(settings, clock=clock, breakers=breakers, **({"sleep": sleep} if sleep else {}))
        self.client = openai.OpenAI(api_key=settings.api_key, base_url=settings.base_url,
                                    timeout=settings.timeout_s, max_retries=0)
        #: the asynchronous client of each drive loop
        self.async_clients = waits.PerLoop(lambda: openai.AsyncOpenAI(
            api_key=settings.api_key, base_url=settings.base_url, timeout=settings.timeout_s, max_retries=0))

    def close(self) -> None:
        """Release the HTTP connections."""
        self.client.close()
        self.async_clients.close(lambda client: client.close())

    # Requests go through the SDK's documented `post` with the body built here, not through
    # `chat.completions.create`: create walks the whole body against its parameter types first (every
    # message, tool and schema key), which changes nothing for a body of plain wire names like this one and
    # cost ~0.4 ms of CPU a call, a third of the SDK's work. The answer is read into the SDK's own types.

    def _completion(self, body: dict[str, Any]) -> ChatCompletion:
        return self.client.post(_PATH, body=body, cast_to=ChatCompletion)

    def _stream(self, body: dict[str, Any]) -> Stream[ChatCompletionChunk]:
        return self.client.post(_PATH, body=body, cast_to=ChatCompletion, stream=True,
                                stream_cls=Stream[ChatCompletionChunk])

    async def _async_completion(self, body: dict[str, Any]) -> ChatCompletion:
        return await self.async_clients.get().post(_PATH, body=body, cast_to=ChatCompletion)

    async def _chunks(self, body: dict[str, Any]) -> list[ChatCompletionChunk]:
        stream = await self.async_clients.get().post(_PATH, body=body, cast_to=ChatCompletion, stream=True,
                                                     stream_cls=AsyncStream[ChatCompletionChunk])
        async with stream:
            return [chunk async for chunk in stream]

    def _attempt(self, model: str, request: LLMRequest) -> LLMResponse:
        names, body = self.body(model, request)
        try:
            if waits.suspendable():  # on a drive loop: the drive switches out until the answer is here
                if body.get("stream"):
                    return self._from_chunks(model, request, names, waits.wait(self._chunks(body)))
                answer = waits.wait(self._async_completion(body))
                if not isinstance(answer, ChatCompletion):
                    raise malformed(PROVIDER, f"expected a chat completion, got {str(answer)[:120]!r}")
                return self._from_completion(model, request, names, answer)
            if body.get("stream"):
                with self._stream(body) as stream:
                    return self._from_chunks(model, request, names, stream)
            completion = self._completion(body)
            if not isinstance(completion, ChatCompletion):
                raise malformed(PROVIDER, f"expected a chat completion, got {str(completion)[:120]!r}")
            return self._from_completion(model, request, names, completion)
        except openai.OpenAIError as exc:
            raise translate(exc) from exc
        except (AttributeError, TypeError, KeyError, ValueError) as exc:  # a body the SDK half-understood
            raise malformed(PROVIDER, f"{type(exc).__name__}: {exc}") from exc

    def body(self, model: str, request: LLMRequest) -> tuple[ToolNames, dict[str, Any]]:
        """The request body (the JSON of a chat-completions request) and the tool-name table."""
        specs = list(request.tools)
        forced = request.purpose == "plan" and self.settings.plan_mode == "tool"
        if forced:
            specs.append(submit_plan_spec())
        names = ToolNames(s.name for s in specs)
        in_prompt = self.settings.tools_in_prompt and not forced
        cap = self.settings.max_output_tokens or request.max_tokens
        body: dict[str, Any] = {"model": model, "messages": _messages(request, in_prompt),
                                "temperature": request.temperature, "max_tokens": min(request.max_tokens, cap)}
        top_p = self.settings.top_p_for(request)
        if top_p is not None:
            body["top_p"] = top_p
        if request.purpose == "plan" and not forced and self.settings.plan_format != "none":
            full = self.settings.plan_format == "json_schema"  # OpenAI's; json_object is a small local model's
            schema = plan_schema(request.tools, self.settings.plan_max_steps, refs=full)
            body["response_format"] = (
                {"type": "json_schema", "json_schema": {"name": "plan", "schema": schema}}
                if self.settings.plan_format == "json_schema" else {"type": "json_object", "schema": schema})
        if specs and not in_prompt:
            body["tools"] = [to_openai(s, names) for s in specs]
            if forced:
                body["tool_choice"] = {"type": "function", "function": {"name": names.wire(SUBMIT_PLAN)}}
            elif request.purpose == "plan":
                body["tool_choice"] = "none"
        if request.stream or self.settings.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return names, body

    def _from_completion(self, model: str, request: LLMRequest, names: ToolNames,
                         completion: ChatCompletion) -> LLMResponse:
        if not completion.choices:
            raise malformed(PROVIDER, "no choices in the completion")
        choice = completion.choices[0]
        raw_calls = [(c.id, c.function.name, _json_arguments(c.function.name, c.function.arguments))
                     for c in choice.message.tool_calls or [] if c.type == "function"]
        usage = completion.usage
        tokens = (usage.prompt_tokens, usage.completion_tokens) if usage else (0, 0)
        return self.response(model, request, names, content=choice.message.content or "",
                              raw_calls=raw_calls, finish=choice.finish_reason, served_by=completion.model,
                              tokens=tokens)

    def _from_chunks(self, model: str, request: LLMRequest, names: ToolNames,
                     stream: Iterable[ChatCompletionChunk]) -> LLMResponse:
        text: list[str] = []
        calls: dict[int, list[str]] = {}
        finish, served_by, tokens = "stop", model, (0, 0)
        for chunk in stream:
            served_by = chunk.model or served_by
            if chunk.usage is not None:
                tokens = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
            for choice in chunk.choices[:1]:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
                for delta in choice.delta.tool_calls or []:
                    slot = calls.setdefault(delta.index, ["", "", ""])
                    slot[0] = delta.id or slot[0]
                    if delta.function is not None:
                        slot[1] += delta.function.name or ""
                        slot[2] += delta.function.arguments or ""
        raw_calls = [(i, n, _json_arguments(n, a)) for i, n, a in (calls[k] for k in sorted(calls))]
        return self.response(model, request, names, content="".join(text), raw_calls=raw_calls,
                              finish=finish, served_by=served_by, tokens=tokens)


def _messages(request: LLMRequest, tools_in_system: bool = False) -> list[dict[str, str]]:
    system = request.system + (tools_in_prompt(request.tools) if tools_in_system else "")
    messages = [{"role": "system", "content": system}] if system else []
    for m in request.messages:
        # History has no tool_call ids to pair a "tool" message with, so tool output is shown as user text.
        role, content = ("user", f"[tool output] {m.content}") if m.role == "tool" else (m.role, m.content)
        messages.append({"role": role, "content": content})
    return messages


def _json_arguments(name: str, raw: str) -> Any:
    try:
        return json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise malformed(PROVIDER, f"arguments of tool call {name!r} are not JSON ({exc.msg}): "
                                  f"{raw[:120]!r}") from exc
