"""The OpenAI chat-completions wire format, for the scripted server: bodies, streams and errors."""

from __future__ import annotations

import json
from typing import Any

from tests.fakes.server import Reply

ToolCall = tuple[str, str, str]  # (id, wire name, raw JSON arguments)


def completion(content: str | None = "", *, tool_calls: list[ToolCall] | None = None, model: str = "gpt-test",
               usage: tuple[int, int] = (11, 7), finish: str = "stop") -> Reply:
    """A non-streamed chat completion."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                                 for i, n, a in tool_calls]
    return Reply(200, {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_000, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    })


def _chunk(model: str, delta: dict[str, Any] | None, finish: str | None = None,
           usage: tuple[int, int] | None = None) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    chunk: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_700_000_000,
                             "model": model, "choices": choices}
    if usage is not None:
        chunk["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                          "total_tokens": sum(usage)}
    return json.dumps(chunk)


def stream(pieces: list[str], *, tool_calls: list[ToolCall] | None = None, model: str = "gpt-test",
           usage: tuple[int, int] = (11, 7)) -> Reply:
    """A streamed completion: content in `pieces`, tool-call arguments split in two, a usage chunk, [DONE]."""
    data = [_chunk(model, {"role": "assistant", "content": ""})]
    data += [_chunk(model, {"content": p}) for p in pieces]
    for index, (call_id, name, arguments) in enumerate(tool_calls or []):
        half = len(arguments) // 2
        first = {"index": index, "id": call_id, "type": "function",
                 "function": {"name": name, "arguments": arguments[:half]}}
        rest = {"index": index, "function": {"arguments": arguments[half:]}}
        data.append(_chunk(model, {"tool_calls": [first]}))
        data.append(_chunk(model, {"tool_calls": [rest]}))
    data.append(_chunk(model, {}, "tool_calls" if tool_calls else "stop"))
    data.append(_chunk(model, None, usage=usage))
    data.append("[DONE]")
    return Reply(events=[(None, d) for d in data])


def error(status: int, message: str, *, code: str | None = None, kind: str = "invalid_request_error",
          headers: dict[str, str] | None = None) -> Reply:
    """An error answer the way OpenAI shapes it."""
    return Reply(status, {"error": {"message": message, "type": kind, "param": None, "code": code}},
                 headers=headers or {})
