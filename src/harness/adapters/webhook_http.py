"""Sending one webhook over HTTP in the Standard Webhooks format (SPEC P4 / N1).

The body is the event's JSON; the headers are `webhook-id` (stable across retries, so the receiver can
deduplicate), `webhook-timestamp` (seconds, when this attempt was signed) and `webhook-signature` (the
`standardwebhooks` library's HMAC-SHA256 over id, timestamp and body, `v1,<base64>`). Redirects are not
followed: a signed event goes to the URL it was addressed to or fails. Errors come back as a
SendOutcome, never raised; the secret never appears in one.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import httpx
from standardwebhooks import Webhook

from harness.domain.webhooks import SendOutcome

USER_AGENT = "harness-kernel-webhooks/1"


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
                 transport: httpx.BaseTransport | None = None) -> None:
        #: the signature's timestamp is what receivers compare with their own clocks: real time always
        self.wall = wall
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s), follow_redirects=False, transport=transport)

    def send(self, url: str, message_id: str, body: str, secret: str) -> SendOutcome:
        """POST one signed event; the outcome of that one attempt."""
        headers = signed_headers(secret, message_id, body, self.wall())
        try:
            response = self._client.post(url, content=body.encode("utf-8"), headers=headers)
        except httpx.TimeoutException as exc:
            return SendOutcome(False, None, f"timed out: {type(exc).__name__}")
        except httpx.HTTPError as exc:
            return SendOutcome(False, None, f"{type(exc).__name__}: {exc}")
        if 200 <= response.status_code < 300:
            return SendOutcome(True, response.status_code)
        return SendOutcome(False, response.status_code, f"answered HTTP {response.status_code}")

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()
