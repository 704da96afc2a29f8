"""Ports of the webhook side (SPEC P4 / N1): the delivery outbox and the signed HTTP send."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from harness.domain.outbound import PUBLIC_ONLY, OutboundRule

if TYPE_CHECKING:
    from harness.domain.webhooks import Delivery, OutgoingEvent, SendOutcome
    from harness.ports import Clock, Tx


class WebhookQueue(Protocol):
    """The webhook outbox: queued inside the change's transaction, claimed under a lease, settled by
    the lease holder only."""

    @property
    def clock(self) -> Clock:
        """The store's clock (timestamps of events, retry times)."""
        ...

    def enqueue(self, tx: Tx, events: Sequence[OutgoingEvent]) -> None:
        """Queue one delivery per event within `tx`."""
        ...

    def run_snapshot(self, tx: Tx, run_id: str) -> tuple[dict[str, Any], list[str]] | None:
        """(run columns, path of states) of a Run as `tx` sees it; None for no such Run."""
        ...

    def run_context(self, tx: Tx, run_id: str) -> dict[str, Any] | None:
        """The Run's RunContext as `tx` sees it (None for none)."""
        ...

    def latest_request(self, tx: Tx, run_id: str) -> dict[str, Any] | None:
        """The Run's newest approval request as `tx` sees it, with its accepted approvers."""
        ...

    def claim(self, owner: str, *, limit: int, lease_s: float, max_attempts: int) -> list[Delivery]:
        """Lease up to `limit` due deliveries to `owner`, counting the attempt."""
        ...

    def delivered(self, owner: str, delivery_id: str, status_code: int) -> bool:
        """Settle a delivery as sent; False when `owner` no longer holds its lease."""
        ...

    def failed(self, owner: str, delivery_id: str, *, error: str, status_code: int | None,
               retry_at: float | None) -> bool:
        """Record a failed attempt (dead when `retry_at` is None); False when the lease was lost."""
        ...


class WebhookSending(Protocol):
    """Sends one signed webhook; errors come back in the outcome, never raised."""

    def send(self, url: str, message_id: str, body: str, secret: str,
             rule: OutboundRule = PUBLIC_ONLY) -> SendOutcome:
        """POST one signed event to a target `rule` allows (public addresses only by default); the outcome
        of that one attempt."""
        ...

    def close(self) -> None:
        """Release the connections."""
        ...


class WebhookDeliveries(Protocol):
    """What operators read and do with deliveries (the API's and the console's webhook pages)."""

    def list(self, *, tenant_id: str | None = None, status: str | None = None, run_id: str | None = None,
             limit: int = 100) -> list[Delivery]:
        """Deliveries, newest first, optionally of one tenant, status or Run."""
        ...

    def get(self, delivery_id: str, tenant_id: str | None = None) -> Delivery | None:
        """One delivery (in the tenant, when given)."""
        ...

    def counts(self, tenant_id: str | None = None) -> dict[str, int]:
        """How many deliveries are in each status."""
        ...

    def redeliver(self, delivery_id: str, *, tenant_id: str | None, actor: str) -> Delivery | None:
        """Queue a dead delivery again (audited); None when there is no dead delivery with that id."""
        ...
