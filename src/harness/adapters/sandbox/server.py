"""The remote sandbox provider's server (`harness sandbox serve`): this host's sandbox over HTTP.

Every request carries `Authorization: Bearer <token>`; any other gets 401. Bodies are JSON, at most
MAX_BODY bytes (413 beyond). The routes mirror the sandbox port and the instance processes:

    GET  /v1/sandbox              {"isolation": "bwrap"}
    POST /v1/run                  job                   -> outcome
    POST /v1/instances            job                   -> holder
    POST /v1/instances/run        {"holder", "job"}     -> outcome
    POST /v1/instances/alive      holder                -> {"alive": bool}
    POST /v1/instances/stop       holder                -> {"stopped": bool}

A job carries the skill's code and the Run's files the server lacks (harness.adapters.sandbox.shipping), and
an outcome the files the call changed. A job naming code or files the server does not have is 409 with
{"missing": "code" | "files"}: the client sends them and asks again.

A call's failure is in its outcome (200), as the port has it; a request that is not one is 400, an instance
that could not start 503, with {"error": ...} naming why.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harness.adapters.sandbox import instance
from harness.adapters.sandbox.shipping import MAX_TRANSFER, TransferError, TransferLimitError
from harness.adapters.sandbox.wire import holder_from_json, holder_to_json, outcome_to_json
from harness.adapters.sandbox.yard import MissingError, Yard
from harness.domain.sandbox import SandboxOutcome
from harness.ports import Sandbox

log = logging.getLogger("harness.sandbox.server")
#: the largest request body read (a job's arguments, code and files travel in it, base64: 4/3 of their size)
MAX_BODY = MAX_TRANSFER * 3 + 8 * 1024 * 1024


class RequestError(Exception):
    """A request the server refuses, with its HTTP status."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


def routes(sandbox: Sandbox, yard: Yard) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """What each POST path does with its JSON body."""
    def arrive(body: Any) -> Any:
        if not isinstance(body, dict):
            raise ValueError("the job must be a JSON object")
        try:
            return yard.receive(body)
        except MissingError as exc:
            raise RequestError(409, str(exc), missing=exc.what) from None
        except TransferLimitError as exc:
            raise RequestError(413, str(exc)) from None
        except TransferError as exc:
            raise RequestError(400, f"not a valid request: {exc}") from None

    def answer(arrived: Any, run: Callable[[], SandboxOutcome]) -> dict[str, Any]:
        outcome, files = yard.changes(arrived, run())
        return {**outcome_to_json(outcome), "files": files}

    def start(body: dict[str, Any]) -> Any:
        arrived = arrive(body)
        try:
            return holder_to_json(sandbox.start_instance(arrived.job))
        except (RuntimeError, OSError) as exc:
            raise RequestError(503, f"the sandbox instance could not start: {exc}") from None

    def run(body: dict[str, Any]) -> Any:
        arrived = arrive(body)
        return answer(arrived, lambda: sandbox.run(arrived.job))

    def run_in(body: dict[str, Any]) -> Any:
        arrived = arrive(body["job"])
        return answer(arrived, lambda: sandbox.run_in(holder_from_json(body["holder"]), arrived.job))

    return {
        "/v1/run": run,
        "/v1/instances": start,
        "/v1/instances/run": run_in,
        "/v1/instances/alive": lambda body: {"alive": instance.alive(holder_from_json(body))},
        "/v1/instances/stop": lambda body: {"stopped": instance.stop(holder_from_json(body))},
    }


def make_server(sandbox: Sandbox, token: str, host: str, port: int, yard: Yard) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) over `sandbox`, accepting only `token`, keeping code and Runs' files
    in `yard`."""
    if not token:
        raise ValueError("the sandbox server needs a token (HARNESS_SANDBOX_TOKEN)")
    table = routes(sandbox, yard)
    expected = f"Bearer {token}".encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _reply(self, status: int, value: Any) -> None:
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "").encode()
            if hmac.compare_digest(given, expected):
                return True
            self.close_connection = True
            self._reply(401, {"error": "a valid bearer token is required"})
            return False

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path != "/v1/sandbox":
                self._reply(404, {"error": f"no such route: GET {self.path}"})
                return
            self._reply(200, {"isolation": sandbox.isolation})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            try:
                self._reply(200, table[self._route()](self._body()))
            except RequestError as exc:
                self.close_connection = True  # its body may be unread
                self._reply(exc.status, {"error": str(exc), **exc.extra})
            except (ValueError, KeyError, TypeError) as exc:
                self._reply(400, {"error": f"not a valid request: {exc}"})

        def _route(self) -> str:
            if self.path not in table:
                raise RequestError(404, f"no such route: POST {self.path}")
            return self.path

        def _body(self) -> dict[str, Any]:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                raise RequestError(411, "a Content-Length is required") from None
            if length > MAX_BODY:
                raise RequestError(413, f"the request body is larger than {MAX_BODY} bytes")
            value = json.loads(self.rfile.read(length))
            if not isinstance(value, dict):
                raise ValueError("the body must be a JSON object")
            return value

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
