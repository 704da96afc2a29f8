"""The HTTP API's request bodies: what a client sends, as the OpenAPI document's schemas give it (SPEC U2).

Request bodies forbid unknown fields and NUL characters. Tenant, user and roles are deliberately absent from
every request body: they come from the caller's credential.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.domain import limits
from harness.domain.contracts import MAX_CHAIN_DEPTH, CallbackUrl, Ident, Message, MetadataKey, StartBy, refuse_nul

#: a SHA-256 in hex, as a request names an action set or a file
HEX64 = r"^[0-9a-f]{64}$"


class Body(BaseModel):
    """Base of request bodies: unknown fields are an error, not silently ignored, and so is a NUL
    character in any text."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        return refuse_nul(value)


class CreateRunBody(Body):
    """What to run. The caller's tenant, user and roles come from their API key.

    Sizes are limited by the service's settings (defaults: task 20,000 characters, history 200 messages
    of 100,000 characters each, metadata 50 entries of 2,000 characters, the body 1 MiB); a field over
    its limit is a 422 naming it, a body over its size a 413. The maxima shown here are the ceilings the
    settings can be raised to."""

    task: str = Field(min_length=1, max_length=limits.TASK_CHARS_CEILING, examples=["Where is order A-1001?"])
    session_id: Ident = "default"
    history: list[Message] = Field(default_factory=list, max_length=limits.HISTORY_MESSAGES_CEILING)
    token_budget: int = Field(default=8_000, ge=256, le=2_000_000)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    retry_of: str | None = Field(default=None, min_length=1, max_length=64)
    metadata: dict[MetadataKey, Annotated[str, Field(max_length=limits.METADATA_VALUE_CHARS_CEILING)]] = Field(
        default_factory=dict, max_length=limits.METADATA_ENTRIES_CEILING)
    team_id: Ident | None = Field(
        default=None,
        description="The collaboration group (team) the Run works for: one of your teams in the identity "
                    "directory (another is a 403). The Run recalls the team's memory besides your own, and its "
                    "child Runs work for the same team.")
    chain_remaining: int | None = Field(
        default=None, ge=0, le=MAX_CHAIN_DEPTH,
        description="Your remaining delegation budget: how many levels of child Runs this Run may start "
                    "(default and maximum: the deployment's HARNESS_CHAIN_DEPTH).")
    callback: CallbackUrl | None = Field(
        default=None,
        description="An http(s) URL the Run's approval requests and its result are pushed to, signed as "
        "Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature).",
        examples=["https://hooks.example.com/harness"],
    )
    start_by: StartBy | None = Field(
        default=None,
        description="The latest moment the Run may start, ISO 8601 with its offset (e.g. "
                    "`2026-12-05T10:00:00Z`). A Run still waiting in the queue then is closed CLOSED_FAILED with "
                    "an error starting `not_started:` instead of running late. Default: the deployment's "
                    "HARNESS_QUEUE_MAX_WAIT_S after acceptance, if set; otherwise it waits as long as it takes. "
                    "A time already past is a 422.",
        examples=["2026-12-05T10:00:00Z"],
    )


class CancelBody(Body):
    """Why the Run is cancelled."""

    reason: str = Field(default="cancelled by the user", min_length=1, max_length=2_000)


class DecisionBody(Body):
    """A human decision on an approval request. The approver is the caller's identity."""

    decision: Literal["approve", "reject"]
    reason: str = Field(default="", max_length=2_000)
    break_glass: bool = False
    actions_hash: str | None = Field(
        default=None,
        pattern=HEX64,
        description="The hash of the actions you reviewed; refused if they changed.",
    )
