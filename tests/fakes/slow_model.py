"""A slow OpenAI-compatible model on 127.0.0.1: one asyncio thread answers every call after `delay_s`.

It answers a plan request (one with a response_format: the harness asks for a JSON plan that way) with a
plan of one step (by default: look the task's order up), and any other request with an answer written
from the last message.
It counts the calls in flight, so a test sees how many model calls the harness had waiting at once, and
it holds no thread per connection, so the thread count a test reads is the harness's own.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path
from types import TracebackType
from typing import Any


def price_file(folder: Path) -> Path:
    """A price file (`HARNESS_LLM_PRICING`) in `folder` for `gpt-test`, the model name the tests give the harness
    for the slow model: a Run's model must be priced."""
    path = folder / "prices.yaml"
    path.write_text("models:\n  gpt-test: {input_per_mtok: 0.15, output_per_mtok: 0.6}\n")
    return path


LOOKUP = {"id": "lookup", "tool_call": {"skill": "orders.lookup", "arguments": {"order_id": "A-1001"}},
          "output_key": "order"}


class SlowModel:
    """Use as a context manager; `url` is the base URL an OpenAI client takes."""

    def __init__(self, delay_s: float = 0.5, step: dict[str, Any] | None = None, *, gather: int = 0,
                 gather_max_s: float = 60.0) -> None:
        self.delay_s = delay_s
        #: hold every answer until this many calls are in flight at once (or gather_max_s passed), so a test
        #: tells "the harness had them all waiting" from "it was quick enough" on a loaded machine
        self.gather = gather
        self.gather_max_s = gather_max_s
        self._gathered: asyncio.Event | None = None
        #: the one step of every plan it answers (by default: look the order up)
        self.step = step or LOOKUP
        self.calls = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="slow-model", daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> SlowModel:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=4096), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._open):
                writer.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
                body = json.loads(await reader.readexactly(length))
                self.calls += 1
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                try:
                    await self._gather()
                    await asyncio.sleep(self.delay_s)
                finally:
                    self.in_flight -= 1
                payload = json.dumps(self._answer(body)).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(payload)).encode() + b"\r\n\r\n" + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._open.discard(writer)
            writer.close()

    async def _gather(self) -> None:
        if self._gathered is None:
            self._gathered = asyncio.Event()
        if self.in_flight >= self.gather:
            self._gathered.set()
        try:
            await asyncio.wait_for(self._gathered.wait(), self.gather_max_s)
        except TimeoutError:
            self._gathered.set()  # the harness never had that many in flight: the test reads the peak

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        if "response_format" in body:
            content = json.dumps({"steps": [self.step], "then": "answer"})
        else:
            content = "Your order: " + str(body["messages"][-1]["content"])[:80]
        return {"id": "chatcmpl-slow", "object": "chat.completion", "created": 1_700_000_000,
                "model": body.get("model", "gpt-test"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}
