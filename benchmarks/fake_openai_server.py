"""A fake OpenAI-compatible chat-completions server on loopback that answers after a set delay (issue 37).

    python benchmarks/fake_openai_server.py --port 8765 --delay 1.0

Each POST /v1/chat/completions waits `--delay` seconds (an asyncio sleep: a wait holds nothing here) and
answers the way a model serving an agent would, for a Run that plans ONE read-only skill call and then
has its answer written from the result:

- a plan request (no results in the conversation) gets a JSON plan as the message content: one step
  calling `orders.lookup` for the order named in the task, then `"then": "answer"`;
- an answer request (a user message carrying "Results of rounds (JSON, by output key):", what harness
  sends for purpose "answer", and what the LangGraph contender sends too) gets a sentence written from
  the order in those results.

It counts the calls in flight (and their peak) and in total: GET /stats reads them, POST /stats/reset
starts a new count (the peak restarts from the calls in flight then). Nothing but the standard library
and uvicorn, so a smoke test needs no extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

#: the user message that carries a Run's results when its answer is asked for (harness.pipeline.rounds)
RESULTS_MARK = "Results of rounds (JSON, by output key):"
#: the read-only skill the plan calls (the bundled support example's)
SKILL = "orders.lookup"
_ORDER = re.compile(r"\b[A-Z]-\d{4}\b")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Counters:
    """Calls in flight, their peak, and totals by purpose."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.reset()

    def reset(self) -> None:
        """A new count; the peak restarts from what is in flight now."""
        self.peak = self.in_flight
        self.calls = 0
        self.by_purpose: dict[str, int] = {"plan": 0, "answer": 0}
        self.errors = 0
        self.since = time.time()

    def snapshot(self) -> dict[str, Any]:
        """What GET /stats answers."""
        return {"in_flight": self.in_flight, "peak_in_flight": self.peak, "calls": self.calls,
                "by_purpose": dict(self.by_purpose), "errors": self.errors, "since": self.since}


def purpose_of(body: dict[str, Any]) -> str:
    """'answer' when the conversation carries a Run's results, else 'plan'."""
    for message in body.get("messages") or ():
        content = message.get("content")
        if isinstance(content, str) and content.startswith(RESULTS_MARK):
            return "answer"
    return "plan"


def plan_for(body: dict[str, Any]) -> str:
    """A JSON plan that calls the read-only skill once for the order the task names."""
    task = next((m.get("content") or "" for m in reversed(body.get("messages") or ()) if m.get("role") == "user"), "")
    found = _ORDER.search(task)
    step = {"id": "lookup", "goal": "Find the order",
            "tool_call": {"skill": SKILL, "arguments": {"order_id": found.group(0) if found else "A-1001"}},
            "output_key": "order"}
    return json.dumps({"steps": [step], "then": "answer"})


def answer_for(body: dict[str, Any]) -> str:
    """A sentence written from the order in the results the request carries."""
    for message in body.get("messages") or ():
        content = message.get("content")
        if isinstance(content, str) and content.startswith(RESULTS_MARK):
            results = json.loads(content.split("\n", 1)[1])
            order = results.get("order") or {}
            return (f"Order {order.get('order_id', '?')} is {order.get('status', 'unknown')} "
                    f"(carrier: {order.get('carrier') or 'none yet'}).")
    return "I could not find the results."


def completion(body: dict[str, Any], content: str) -> dict[str, Any]:
    """A non-streamed chat completion carrying `content`."""
    prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages") or ())
    usage = (max(1, prompt // 4), max(1, len(content) // 4))
    return {"id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}


class FakeOpenAI:
    """The ASGI app: chat completions after a delay, and the counters."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.counters = Counters()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()  # startup
            await send({"type": "lifespan.startup.complete"})
            await receive()  # shutdown
            await send({"type": "lifespan.shutdown.complete"})
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/stats":
            await _reply(send, 200, self.counters.snapshot())
        elif method == "POST" and path == "/stats/reset":
            self.counters.reset()
            await _reply(send, 200, self.counters.snapshot())
        elif method == "POST" and path.endswith("/chat/completions"):
            await self._complete(receive, send)
        else:
            await _reply(send, 404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}})

    async def _complete(self, receive: Receive, send: Send) -> None:
        counters = self.counters
        counters.in_flight += 1
        counters.peak = max(counters.peak, counters.in_flight)
        counters.calls += 1
        try:
            body = json.loads(await _body(receive))
            purpose = purpose_of(body)
            counters.by_purpose[purpose] += 1
            await asyncio.sleep(self.delay_s)
            content = plan_for(body) if purpose == "plan" else answer_for(body)
            await _reply(send, 200, completion(body, content))
        except (ValueError, KeyError, AttributeError) as exc:
            counters.errors += 1
            await _reply(send, 400, {"error": {"message": f"{type(exc).__name__}: {exc}",
                                               "type": "invalid_request_error"}})
        finally:
            counters.in_flight -= 1


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _reply(send: Send, status: int, doc: Any) -> None:
    data = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    """Command line: serve until killed."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds before each completion is answered")
    args = parser.parse_args()
    # loopback only; a backlog and no concurrency limit so that thousands of calls can wait at once
    uvicorn.run(FakeOpenAI(args.delay), host="127.0.0.1", port=args.port, log_level="warning", access_log=False,
                backlog=8192, timeout_keep_alive=120)


if __name__ == "__main__":
    main()
