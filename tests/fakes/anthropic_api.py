"""The Anthropic messages wire format, for the scripted server: bodies, event streams and errors."""

from __future__ import annotations

import json
from typing import Any

from tests.fakes.server import Reply

ToolUse = tuple[str, str, Any]  # (id, wire name, input)


def message(text: str = "", *, tool_uses: list[ToolUse] | None = None, model: str = "claude-test",
            usage: tuple[int, int] = (13, 5), stop: str = "end_turn") -> Reply:
    """A non-streamed message."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": i, "name": n, "input": inp} for i, n, inp in tool_uses or []]
    return Reply(200, {
        "id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": "tool_use" if tool_uses else stop, "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    })


def stream(pieces: list[str], *, tool_uses: list[tuple[str, str, str]] | None = None,
           model: str = "claude-test", usage: tuple[int, int] = (13, 5)) -> Reply:
    """A streamed message: text deltas, tool input as partial JSON (raw text, split in two), usage."""
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": usage[0], "output_tokens": 1}}}
    events: list[tuple[str | None, str]] = [("message_start", json.dumps(start)),
                                            ("ping", '{"type": "ping"}')]
    index = 0
    if pieces:
        events.append(("content_block_start", json.dumps(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})))
        events += [("content_block_delta", json.dumps(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}))
            for p in pieces]
        events.append(("content_block_stop", json.dumps({"type": "content_block_stop", "index": 0})))
        index = 1
    for offset, (tool_id, name, raw_input) in enumerate(tool_uses or []):
        i = index + offset
        half = len(raw_input) // 2
        events.append(("content_block_start", json.dumps({"type": "content_block_start", "index": i,
            "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}}})))
        for part in (raw_input[:half], raw_input[half:]):
            events.append(("content_block_delta", json.dumps({"type": "content_block_delta", "index": i,
                "delta": {"type": "input_json_delta", "partial_json": part}})))
        events.append(("content_block_stop", json.dumps({"type": "content_block_stop", "index": i})))
    events.append(("message_delta", json.dumps({"type": "message_delta",
        "delta": {"stop_reason": "tool_use" if tool_uses else "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": usage[1]}})))
    events.append(("message_stop", json.dumps({"type": "message_stop"})))
    return Reply(events=events)


def error(status: int, kind: str, text: str, *, headers: dict[str, str] | None = None) -> Reply:
    """An error answer the way Anthropic shapes it."""
    return Reply(status, {"type": "error", "error": {"type": kind, "message": text}}, headers=headers or {})


def stream_error(kind: str, text: str) -> Reply:
    """A stream that starts, then reports an error event (e.g. overloaded) instead of finishing."""
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}}
    return Reply(events=[("message_start", json.dumps(start)),
                         ("error", json.dumps({"type": "error", "error": {"type": kind, "message": text}}))])
