"""The signed HTTP sender of webhook events (imported at first use: it loads httpx)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.adapters.webhook_http import WebhookSender


def webhook_sender(timeout_s: float) -> WebhookSender:
    """A signed HTTP sender of webhook events (the caller closes it)."""
    from harness.adapters.webhook_http import WebhookSender

    return WebhookSender(timeout_s)
