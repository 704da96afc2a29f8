"""Webhook values (SPEC P4 / N1): an event as queued, a delivery as stored, how one send went."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: a delivery's states: waiting (and retried), delivered, given up
PENDING, DELIVERED, DEAD = "pending", "delivered", "dead"
STATUSES = (PENDING, DELIVERED, DEAD)
#: the variable holding the Standard Webhooks secret when no webhooks file names one per tenant
DEFAULT_SECRET_ENV = "HARNESS_WEBHOOK_SECRET"
#: the longest one send may wait for its receiver's answer, in seconds
MAX_SEND_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class OutgoingEvent:
    """One event for one endpoint, as the notifier queues it."""

    event_id: str
    event_type: str
    run_id: str | None
    tenant_id: str
    endpoint: str
    url: str
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery as stored."""

    delivery_id: str
    event_id: str
    event_type: str
    run_id: str | None
    tenant_id: str
    endpoint: str
    url: str
    payload: str
    status: str
    attempts: int
    next_attempt_at: float
    last_status: int | None
    last_error: str | None
    created_at: float
    delivered_at: float | None

    def data(self) -> dict[str, Any]:
        """The payload, parsed."""
        parsed: dict[str, Any] = json.loads(self.payload)
        return parsed


@dataclass(frozen=True, slots=True)
class SendOutcome:
    """How one attempt went: `ok` for a 2xx answer; otherwise the status (None if there was none), why (a
    category: "refused", "timed out", "HTTP 5xx"), and whether trying again may help."""

    ok: bool
    status_code: int | None
    error: str | None = None
    retry: bool = True
