"""Sending one webhook over HTTP in the Standard Webhooks format (SPEC P4 / N1).

The body is the event's JSON; the headers are `webhook-id` (stable across retries, so the receiver can
deduplicate), `webhook-timestamp` (seconds, when this attempt was signed) and `webhook-signature` (the
`standardwebhooks` library's HMAC-SHA256 over id, timestamp and body, `v1,<base64>`). Redirects are not
followed: a signed event goes to the URL it was addressed to or fails. Errors come back as a
SendOutcome, never raised; the secret never appears in one.

Every send is guarded (harness.domain.outbound): the URL's host is resolved here, each address checked
against the tenant's rule, and the request goes to the checked address itself (the Host header and, for
https, the TLS server name and certificate check keep the URL's name), so the name cannot be made to point
elsewhere between the check and the connection. What a failure says is a category a tenant may read
("refused", "timed out", "HTTP 5xx"), never the network's own answer; the detail goes to the log.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING

from standardwebhooks import Webhook

from harness.domain.outbound import (
    PUBLIC_ONLY,
    OutboundGuard,
    OutboundRefusedError,
    OutboundRule,
    OutboundUnresolvedError,
    pinned,
)
from harness.domain.webhooks import SendOutcome
from harness.settings import system_resolver

if TYPE_CHECKING:
    import httpx

USER_AGENT = "harness-kernel-webhooks/1"
log = logging.getLogger("harness.webhooks")
#: the category of a send that was not made because the target is an address the tenant may not reach
REFUSED_TARGET = "refused: the address is not allowed"


def signed_headers(secret: str, message_id: str, body: str, at: float) -> dict[str, str]:
    """The Standard Webhooks headers for `body` sent as `message_id` at `at` (epoch seconds)."""
    timestamp = dt.datetime.fromtimestamp(int(at), dt.UTC)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at)),
        "webhook-signature": Webhook(secret).sign(message_id, timestamp, body),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }


class WebhookSender:
    """Posts signed webhooks; one pooled HTTP client per sender."""

    def __init__(self, timeout_s: float, *, wall: Callable[[], float] = time.time,
                 transport: httpx.BaseTransport | None = None, guard: OutboundGuard | None = None) -> None:
        #: the signature's timestamp is what receivers compare with their own clocks: real time always
        self.wall = wall
        self._timeout_s = timeout_s
        self._transport = transport
        self.guard = guard or OutboundGuard(system_resolver)
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def _http(self) -> httpx.Client:
        """The pooled client, made with the first send: a process whose outbox never holds a delivery (no
        webhook configured) loads no HTTP client at all."""
        with self._lock:
            if self._client is None:
                import httpx

                self._client = httpx.Client(timeout=httpx.Timeout(self._timeout_s), follow_redirects=False,
                                            transport=self._transport)
            return self._client

    def send(self, url: str, message_id: str, body: str, secret: str,
             rule: OutboundRule = PUBLIC_ONLY) -> SendOutcome:
        """POST one signed event to a target `rule` allows; the outcome of that one attempt."""
        host = urllib.parse.urlsplit(url).hostname or ""
        try:
            address = self.guard.addresses(host, rule)[0]
        except OutboundRefusedError as exc:
            log.warning("webhook %s not sent: %s", message_id, exc)
            return SendOutcome(False, None, REFUSED_TARGET, retry=False)
        except OutboundUnresolvedError:
            log.info("webhook %s: the host %r does not resolve", message_id, host)
            return SendOutcome(False, None, "unreachable")
        target, headers, extensions = pinned(url, address)
        headers.update(signed_headers(secret, message_id, body, self.wall()))
        client = self._http()
        import httpx

        try:
            response = client.post(target, content=body.encode("utf-8"), headers=headers, extensions=extensions)
        except httpx.HTTPError as exc:
            log.info("webhook %s to %s failed: %s: %s", message_id, url, type(exc).__name__, exc)
            return SendOutcome(False, None, failure_category(exc))
        if 200 <= response.status_code < 300:
            return SendOutcome(True, response.status_code)
        log.info("webhook %s to %s answered HTTP %s", message_id, url, response.status_code)
        return SendOutcome(False, response.status_code, f"HTTP {response.status_code // 100}xx")

    def close(self) -> None:
        """Release the connection pool."""
        with self._lock:
            if self._client is not None:
                self._client.close()


def failure_category(exc: Exception) -> str:
    """What a tenant is told of a send that got no answer: a category, not the network's words."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    if isinstance(exc, httpx.ConnectError):
        return "refused" if isinstance(exc.__cause__ or exc.__context__, ConnectionRefusedError) \
            or "refused" in str(exc).lower() else "unreachable"
    return "failed"
