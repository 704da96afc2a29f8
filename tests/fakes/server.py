"""A scripted HTTP server on 127.0.0.1 (an ephemeral port, in a thread) that records what it is sent.

Tests queue replies — a JSON body, a stream of server-sent events, or an error with headers — and the
server answers each POST with the next one, so an SDK talks to a real socket and parses real bytes.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass
class Reply:
    """One scripted answer: a status with a JSON body, or (with `events`) a 200 event stream."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str | None, str]] | None = None  # (event name or None, data) pairs
    raw: bytes | None = None  # a body sent verbatim, for malformed answers
    delay_s: float = 0.0  # wait this long before answering (to make clients time out)


@dataclass
class Received:
    """One request the server got."""

    path: str
    headers: dict[str, str]
    body: Any


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (a timeout test) is expected, not an error to print."""


class ScriptedServer:
    """Answers POSTs from a queue of Replies; use as a context manager."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._httpd = _QuietServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-api", daemon=True)

    @property
    def origin(self) -> str:
        """http://127.0.0.1:<port>"""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def queue(self, *replies: Reply) -> None:
        """Answer the next requests with these replies, in order."""
        with self._lock:
            self.replies.extend(replies)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _next(self, received: Received) -> Reply:
        with self._lock:
            self.received.append(received)
            if self.replies:
                return self.replies.popleft()
        return Reply(500, {"error": {"message": "the test queued no reply for this request"}})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                body = json.loads(raw) if raw else None
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = server._next(Received(self.path, headers, body))
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.events is not None:
                    self._stream(reply)
                else:
                    self._send(reply)

            def _send(self, reply: Reply) -> None:
                data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, reply: Reply) -> None:
                self.send_response(reply.status)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for event, data in reply.events or []:
                    frame = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
                    self.wfile.write(frame.encode())
                    self.wfile.flush()
                self.close_connection = True

        return Handler
