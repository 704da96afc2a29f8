"""How the HTTP service is configured (SPEC U2-U4); every field has a HARNESS_* environment variable."""

from __future__ import annotations

import os
import secrets
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.domain.durations import Seconds, SecondsOrZero
from harness.domain.errors import InvalidRequestError

_ENV = {
    "queue_limit": "HARNESS_QUEUE_LIMIT",
    "http_threads": "HARNESS_HTTP_THREADS",
    "housekeeping_interval_s": "HARNESS_HOUSEKEEPING_S",
    "otel_exporter": "HARNESS_OTEL_EXPORTER",
    "session_secret": "HARNESS_SESSION_SECRET",
    "cookie_secure": "HARNESS_COOKIE_SECURE",
    "webhook_interval_s": "HARNESS_WEBHOOK_INTERVAL_S",
}


class ServiceSettings(BaseModel):
    """The service's own knobs; the Runtime's settings (database, skills, policy) are harness.settings'.
    Every duration (a field ending in `_s`) is a finite number of seconds of at most MAX_DURATION_S (366
    days), as the Runtime's are."""

    model_config = ConfigDict(extra="forbid")
    #: Runs the embedded worker drives at once (`--workers`); None: the runtime's drive_concurrency
    #: (HARNESS_DRIVE_CONCURRENCY, harness.settings)
    concurrency: int | None = Field(default=None, ge=1, le=100_000)
    #: Runs the embedded worker queues in memory (driven or waiting for a place); an accepted Run beyond it
    #: is not refused: the re-drive takes it from the database, oldest first, when there is room
    queue_limit: int = Field(default=10_000, ge=1)
    #: threads the request handlers that block (on the database) share; the rest of a burst of requests
    #: waits for one in the event loop instead of queueing for a database connection with the drives
    http_threads: int = Field(default=16, ge=1, le=1_000)
    #: how often approval timeouts are applied and the trace outbox is drained
    housekeeping_interval_s: Seconds = 1.0
    #: how often a waiting request or event stream re-reads the database (Runs driven by other processes)
    poll_interval_s: Seconds = 0.5
    max_wait_s: Seconds = 300.0
    #: an event stream ends after this long; browsers' EventSource reconnects with Last-Event-ID
    stream_lifetime_s: Seconds = 60.0
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    #: signs console session cookies; random per process unless configured (sessions then end on restart)
    session_secret: str = Field(default_factory=lambda: secrets.token_hex(32), min_length=16)
    session_ttl_s: Seconds = 12 * 3600.0
    cookie_secure: bool = False
    #: how often the embedded delivery loop sends due webhooks; 0 turns it off (Celery workers deliver)
    webhook_interval_s: SecondsOrZero = 1.0

    @classmethod
    def from_env(cls, **overrides: object) -> ServiceSettings:
        """Settings from HARNESS_* environment variables, then explicit overrides."""
        values: dict[str, object] = {k: os.environ[v] for k, v in _ENV.items() if os.environ.get(v)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValueError as exc:
            raise InvalidRequestError(f"invalid service settings: {exc}") from exc
