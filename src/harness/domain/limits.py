"""How large a Run request may be (SPEC U1, U2): every field, and the request as a whole.

The limits are settings (each with a HARNESS_* environment variable); the ceilings below are what a
setting may be raised to, and what the request contracts themselves refuse whatever the settings say.
`harness.pipeline.intake.check_request` runs at submit, before anything is stored: a request over a
limit creates nothing.
A field over its limit is an InvalidRequestError naming the field (HTTP 422, CLI exit 2); the request
as a whole over its size is a RequestTooLargeError (HTTP 413, CLI exit 2).
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.domain.errors import InvalidRequestError

#: what a limit may be raised to (and what the contracts refuse outright)
TASK_CHARS_CEILING = 200_000
HISTORY_MESSAGES_CEILING = 10_000
MESSAGE_CHARS_CEILING = 1_000_000
METADATA_ENTRIES_CEILING = 1_000
METADATA_KEY_CHARS = 128
METADATA_VALUE_CHARS_CEILING = 100_000
REQUEST_BYTES_CEILING = 64 * 1024 * 1024
ROLES_CEILING = 64

#: field -> environment variable
ENV = {
    "max_request_bytes": "HARNESS_MAX_REQUEST_BYTES",
    "max_task_chars": "HARNESS_MAX_TASK_CHARS",
    "max_history_messages": "HARNESS_MAX_HISTORY_MESSAGES",
    "max_message_chars": "HARNESS_MAX_MESSAGE_CHARS",
    "max_metadata_entries": "HARNESS_MAX_METADATA_ENTRIES",
    "max_metadata_value_chars": "HARNESS_MAX_METADATA_VALUE_CHARS",
}


class RequestLimits(BaseModel):
    """The documented limits of a Run request (README, configuration)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    #: the whole request: the HTTP body in bytes, or the request's JSON in UTF-8 bytes
    max_request_bytes: int = Field(default=1_048_576, ge=1_024, le=REQUEST_BYTES_CEILING)
    max_task_chars: int = Field(default=20_000, ge=1, le=TASK_CHARS_CEILING)
    max_history_messages: int = Field(default=200, ge=0, le=HISTORY_MESSAGES_CEILING)
    max_message_chars: int = Field(default=100_000, ge=1, le=MESSAGE_CHARS_CEILING)
    max_metadata_entries: int = Field(default=50, ge=0, le=METADATA_ENTRIES_CEILING)
    max_metadata_value_chars: int = Field(default=2_000, ge=1, le=METADATA_VALUE_CHARS_CEILING)

    @classmethod
    def from_env(cls) -> RequestLimits:
        """The limits the HARNESS_MAX_* environment variables set, the defaults otherwise."""
        values = {field: os.environ[name] for field, name in ENV.items() if os.environ.get(name)}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = str(err["loc"][0]) if err["loc"] else "?"
            raise InvalidRequestError(f"{ENV.get(field, field)}: {err['msg']}") from exc
