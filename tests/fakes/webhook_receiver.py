"""A real webhook receiver on 127.0.0.1 that checks every delivery's Standard Webhooks signature with the
`standardwebhooks` library, as an integrator's endpoint would.

It answers by mode — "ok" (204), "500", "slow" (waits `delay_s`, then 204) or "hang" (reads the body,
logs it, then never answers until killed) — and records each request with whether its signature held.
It runs in a thread (`WebhookReceiver`) or as its own OS process (`python -m tests.fakes.webhook_receiver
PORT SECRET LOG MODE`) that a test can SIGKILL mid-delivery; the process appends one JSON line per
request to LOG, flushed and fsynced before it answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

SECRET = "whsec_" + "dGVzdC13ZWJob29rLXNlY3JldC0wMTIzNDU2Nzg5YWI="  # base64 of a 32-byte test key


@dataclass
class Got:
    """One request as received: the webhook-id, whether the signature verified, the parsed body."""

    webhook_id: str
    valid: bool
    body: dict[str, Any] | None
    path: str
    at: float


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A sender that gave up (timeout) is expected here."""


def _handler(receiver: WebhookReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            raw = self.rfile.read(length)
            if len(raw) < length:  # the sender died mid-request (a test SIGKILLed it): nothing was delivered,
                self.close_connection = True  # as a web framework would not hand a cut request to its app
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                body = receiver.verifier.verify(raw, headers)
                valid = True
            except (WebhookVerificationError, ValueError):
                body, valid = None, False
            receiver.record(Got(headers.get("webhook-id", ""), valid, body, self.path, time.time()))
            mode = receiver.mode
            if mode == "hang":
                time.sleep(3600)
            if mode == "slow":
                time.sleep(receiver.delay_s)
            self.send_response(500 if mode == "500" or not valid else 204)
            self.send_header("content-length", "0")
            self.end_headers()

    return Handler


class WebhookReceiver:
    """The receiver in a thread of this process; use as a context manager."""

    def __init__(self, secret: str = SECRET, *, port: int = 0, mode: str = "ok", delay_s: float = 2.0,
                 log_path: str | None = None) -> None:
        self.verifier = Webhook(secret)
        self.mode = mode
        self.delay_s = delay_s
        self.log_path = log_path
        self.got: list[Got] = []
        self._lock = threading.Lock()
        self._httpd = _Quiet(("127.0.0.1", port), _handler(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True, name="webhook-receiver")

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The receiving URL."""
        return f"http://127.0.0.1:{self.port}/hooks"

    def record(self, got: Got) -> None:
        """Keep one request (and append it to the log file, synced, when there is one)."""
        with self._lock:
            self.got.append(got)
            if self.log_path:
                with open(self.log_path, "a", encoding="utf-8") as log:
                    log.write(json.dumps(got.__dict__) + "\n")
                    log.flush()
                    os.fsync(log.fileno())

    def valid(self) -> list[Got]:
        """The requests whose signature verified."""
        with self._lock:
            return [g for g in self.got if g.valid]

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def start_process(port: int, log: str, mode: str, delay_s: float = 2.0, secret: str = SECRET) -> subprocess.Popen[str]:
    """The receiver as its own OS process on `port`, once it is listening."""
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.webhook_receiver", str(port), secret, log, mode,
                             str(delay_s)], cwd=root, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": root})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"the receiver did not start: {line!r}"
    return proc


def read_log(path: str) -> list[Got]:
    """The requests a receiver process logged (a line cut short by a kill is dropped)."""
    found = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            found.append(Got(**json.loads(line)))
        except ValueError:
            continue
    return found


def main() -> None:
    """PORT SECRET LOG MODE [DELAY_S]: serve until killed."""
    port, secret, log, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    delay = float(sys.argv[5]) if len(sys.argv) > 5 else 2.0
    receiver = WebhookReceiver(secret, port=port, mode=mode, log_path=log, delay_s=delay)
    with receiver:
        print("ready", flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
