"""ASGI middleware: a request body larger than the configured limit is a 413, before any route reads it.

A declared Content-Length over the limit is answered at once, without reading the body; otherwise the
body is read up to the limit (a chunked or lying client cannot stream more) and replayed to the app.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

SETTING = "HARNESS_MAX_REQUEST_BYTES"


class BodyLimit:
    """Refuses request bodies over `max_bytes` with the service's JSON error shape."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the declared length, then the actual one, then hand the request on."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, f"the request body is {int(declared)} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                await self.app(scope, _replay(receive, [message]), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._refuse(send, f"the request body is over {self.max_bytes} bytes")
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(receive, [{"type": "http.request", "body": b"".join(chunks),
                                                  "more_body": False}]), send)

    async def _refuse(self, send: Send, what: str) -> None:
        detail = f"{what}; the limit is {self.max_bytes} bytes ({SETTING})"
        payload = json.dumps({"error": "request_too_large", "detail": detail}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


def _replay(receive: Receive, pending: list[Message]) -> Receive:
    """A receive callable that gives the messages already read, then the client's own (a disconnect)."""

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


class NulGuard:
    """Refuses a request whose path or query holds a NUL character (``%00``) with a 422: no identifier or
    filter holds one, and a database would fail on it rather than find nothing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the path and the query, then hand the request on."""
        if scope["type"] == "http" and ("\x00" in scope.get("path", "") or _query_has_nul(scope)):
            payload = json.dumps({"error": "invalid_request",
                                  "detail": "the URL must not contain NUL characters (%00)"}).encode()
            await send({"type": "http.response.start", "status": 422,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return
        await self.app(scope, receive, send)


def _query_has_nul(scope: Scope) -> bool:
    query = bytes(scope.get("query_string", b""))
    return b"\x00" in query or b"%00" in query
