"""The delivery loop (SPEC P4 / N1): claim due deliveries, send them signed, settle each outcome.

A pass claims a batch under a lease (the outbox counts the attempt first), sends each delivery, and
records delivered, or the next attempt after an exponential backoff with a little jitter, or dead after
the configured number of attempts. Several processes may run passes at once: a delivery is held by one
of them at a time. A process killed mid-pass leaves its claimed deliveries to be sent again when their
lease ends — with the same webhook-id, so a receiver that did get the first copy can drop the second.
It runs in the embedded service (its own thread), as a Celery task on beat for scale-out, and as
`harness webhooks deliver`.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from dataclasses import dataclass, field

from harness.domain.ids import ordered_id
from harness.domain.webhooks import Delivery
from harness.ports.webhooks import WebhookQueue, WebhookSending
from harness.webhooks.config import WebhookConfig

log = logging.getLogger("harness.webhooks")


@dataclass
class DeliveryReport:
    """What one or more passes did, by delivery id."""

    delivered: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    lost_lease: list[str] = field(default_factory=list)

    @property
    def attempted(self) -> int:
        """How many deliveries were tried."""
        return len(self.delivered) + len(self.retrying) + len(self.dead) + len(self.lost_lease)

    def add(self, other: DeliveryReport) -> None:
        """Fold another pass's report into this one."""
        for name in ("delivered", "retrying", "dead", "lost_lease"):
            getattr(self, name).extend(getattr(other, name))

    def to_dict(self) -> dict[str, list[str]]:
        """A JSON-ready document."""
        return {"delivered": self.delivered, "retrying": self.retrying, "dead": self.dead,
                "lost_lease": self.lost_lease}


class WebhookDispatcher:
    """Delivers the outbox's due webhooks."""

    def __init__(self, outbox: WebhookQueue, config: WebhookConfig, sender: WebhookSending,
                 *, owner: str | None = None) -> None:
        self.outbox = outbox
        self.config = config
        self.sender = sender
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{ordered_id()[-12:]}"

    def backoff(self, attempts: int) -> float:
        """Seconds to wait after the `attempts`-th failed attempt: doubling, capped, with up to 10% jitter
        (so the deliveries of one outage do not all come back in the same second)."""
        policy = self.config.delivery
        delay = min(policy.max_backoff_s, policy.backoff_s * 2 ** max(attempts - 1, 0))
        return float(delay * (1 + random.uniform(0, 0.1)))

    def deliver_once(self, limit: int | None = None) -> DeliveryReport:
        """One pass: claim a batch of due deliveries and send them."""
        policy, report = self.config.delivery, DeliveryReport()
        claimed = self.outbox.claim(self.owner, limit=limit or policy.batch, lease_s=policy.lease,
                                    max_attempts=policy.max_attempts)
        for delivery in claimed:
            self._deliver(delivery, report)
        return report

    def deliver_all(self, max_passes: int = 1000) -> DeliveryReport:
        """Passes until nothing is due (deliveries retried later are left for later passes)."""
        total = DeliveryReport()
        for _ in range(max_passes):
            report = self.deliver_once()
            total.add(report)
            if report.attempted == 0:
                break
        return total

    def _deliver(self, delivery: Delivery, report: DeliveryReport) -> None:
        secret = self.config.secret(delivery.endpoint)
        if secret is None:
            outcome_error, status, retry = f"the endpoint {delivery.endpoint!r} is no longer configured", None, False
        else:
            sent = self.sender.send(delivery.url, delivery.delivery_id, delivery.payload, secret,
                                    rule=self.config.outbound_rule(delivery.tenant_id))
            if sent.ok:
                held = self.outbox.delivered(self.owner, delivery.delivery_id, sent.status_code or 200)
                (report.delivered if held else report.lost_lease).append(delivery.delivery_id)
                return
            outcome_error, status, retry = sent.error or "failed", sent.status_code, sent.retry
        last = delivery.attempts >= self.config.delivery.max_attempts or not retry
        retry_at = None if last else self.outbox.clock.now() + self.backoff(delivery.attempts)
        held = self.outbox.failed(self.owner, delivery.delivery_id, error=outcome_error, status_code=status,
                                  retry_at=retry_at)
        if not held:
            report.lost_lease.append(delivery.delivery_id)
        elif last:
            report.dead.append(delivery.delivery_id)
            log.warning("webhook delivery is dead", extra={"delivery_id": delivery.delivery_id,
                                                           "event_id": delivery.event_id, "endpoint": delivery.endpoint,
                                                           "attempts": delivery.attempts, "error": outcome_error})
        else:
            report.retrying.append(delivery.delivery_id)

    def close(self) -> None:
        """Release the HTTP client."""
        self.sender.close()


class DeliveryThread:
    """The embedded service's delivery loop: a pass every `interval_s`, in a thread of its own."""

    def __init__(self, dispatcher: WebhookDispatcher, interval_s: float = 1.0) -> None:
        self.dispatcher = dispatcher
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the loop (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="harness-webhooks", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 15.0) -> None:
        """End the loop after the send in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.dispatcher.deliver_all(max_passes=20)
            except Exception:  # a database hiccup must not end the loop; the next pass retries
                log.exception("webhook delivery pass failed")
