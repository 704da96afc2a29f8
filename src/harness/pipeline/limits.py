"""How large a Run request may be (SPEC U1, U2): every field, and the request as a whole.

The limits are settings (each with a HARNESS_* environment variable); the ceilings below are what a
setting may be raised to, and what the request contracts themselves refuse whatever the settings say.
`check_request` runs at submit, before anything is stored: a request over a limit creates nothing.
A field over its limit is an InvalidRequestError naming the field (HTTP 422, CLI exit 2); the request
as a whole over its size is a RequestTooLargeError (HTTP 413, CLI exit 2).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.errors import InvalidRequestError, RequestTooLargeError

if TYPE_CHECKING:
    from harness.pipeline.contracts import RunRequest

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


def _over(field: str, size: int, unit: str, limit: int, setting: str) -> InvalidRequestError:
    return InvalidRequestError(f"invalid run request: {field}: {size} {unit}; the limit is {limit} ({ENV[setting]})")


def check_request(request: RunRequest, limits: RequestLimits, size_bytes: int) -> None:
    """Raise when a field of `request`, or the request as a whole (`size_bytes` of JSON), is over its limit."""
    if len(request.task) > limits.max_task_chars:
        raise _over("task", len(request.task), "characters", limits.max_task_chars, "max_task_chars")
    if len(request.history) > limits.max_history_messages:
        raise _over("history", len(request.history), "messages", limits.max_history_messages,
                    "max_history_messages")
    for i, message in enumerate(request.history):
        if len(message.content) > limits.max_message_chars:
            raise _over(f"history.{i}.content", len(message.content), "characters", limits.max_message_chars,
                        "max_message_chars")
    if len(request.metadata) > limits.max_metadata_entries:
        raise _over("metadata", len(request.metadata), "entries", limits.max_metadata_entries,
                    "max_metadata_entries")
    for key, value in request.metadata.items():
        if len(value) > limits.max_metadata_value_chars:
            raise _over(f"metadata.{key}", len(value), "characters", limits.max_metadata_value_chars,
                        "max_metadata_value_chars")
    if size_bytes > limits.max_request_bytes:
        raise RequestTooLargeError(f"invalid run request: the request is {size_bytes} bytes; the limit is "
                                   f"{limits.max_request_bytes} ({ENV['max_request_bytes']})")
