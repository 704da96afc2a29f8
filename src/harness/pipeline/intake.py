"""What happens to a Run request at submit, before anything is stored (step ①; SPEC U1, U2, C4, K5).

1. Its size is checked against the configured limits (harness.domain.limits): over a limit, nothing
   is created.
2. Secrets are removed from every free-text field — the task, each history message, the metadata and
   the memory query — with the same filter the context assembler uses (SPEC C4, amended): the filtered
   request is what is stored, traced, shown and returned; the raw secret is never stored anywhere.
   A filter that fails refuses the request (SecretFilterError naming the field): nothing is created.
3. A request that names no roles gets its identity's roles from the identity directory, and none when
   the directory does not know it: no role is ever assumed by default.
4. The body's digest (the filtered request without the caller's identity and the key itself) is what an
   idempotency key is bound to: the same key with another body is a conflict, not the old Run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from harness.context.errors import SecretFilterError
from harness.context.secrets import SecretFilter
from harness.domain.chain import canonical_json, content_hash
from harness.domain.contracts import RunRequest
from harness.domain.errors import InvalidRequestError, RequestTooLargeError
from harness.domain.limits import ENV, RequestLimits

#: fields that say who asks, not what is asked: not part of the body an idempotency key is bound to
IDENTITY_FIELDS = ("tenant_id", "user_id", "roles", "idempotency_key")


def _clean(scrub: SecretFilter, field: str, text: str) -> str:
    try:
        return scrub.scrub(text).text
    except SecretFilterError as exc:  # the request is refused: nothing is stored that was not filtered
        raise SecretFilterError(f"{field}: {exc}; the request was not accepted") from exc


def redact(request: RunRequest, scrub: SecretFilter) -> RunRequest:
    """`request` with secrets removed from its task, history, metadata and memory query."""
    doc: dict[str, Any] = request.model_dump(mode="json")
    doc["task"] = _clean(scrub, "task", request.task)
    doc["history"] = [{**m, "content": _clean(scrub, f"history.{i}.content", m["content"])}
                      for i, m in enumerate(doc["history"])]
    doc["metadata"] = {_clean(scrub, "metadata", key): _clean(scrub, f"metadata.{key}", value)
                       for key, value in request.metadata.items()}
    if request.memory is not None and request.memory.query:
        doc["memory"]["query"] = _clean(scrub, "memory.query", request.memory.query)
    try:
        return RunRequest.model_validate(doc)
    except ValidationError as exc:  # e.g. a placeholder made a field longer than its ceiling
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(request)"
        raise InvalidRequestError(f"invalid run request: {where}: {err['msg']} (after removing secrets)") from exc


#: the roles the identity directory gives an identity (tenant, user); () for one it does not know
RolesOf = Callable[[str, str], tuple[str, ...]]


def admit(request: RunRequest, limits: RequestLimits, scrub: SecretFilter,
          roles_of: RolesOf | None = None) -> RunRequest:
    """The request as it will be stored: within its limits, with its secrets removed, and with roles:
    those it names, else its identity's from the directory — none for an unknown identity."""
    check_request(request, limits, len(canonical_json(request.model_dump(mode="json")).encode("utf-8")))
    if "roles" not in request.model_fields_set:
        request = request.model_copy(update={"roles": roles_of(request.tenant_id, request.user_id) if roles_of
                                              else ()})
    return redact(request, scrub)


def body_hash(request: RunRequest) -> str:
    """The digest an idempotency key is bound to: the (filtered) request minus who sent it."""
    doc = request.model_dump(mode="json")
    return content_hash({k: v for k, v in doc.items() if k not in IDENTITY_FIELDS})


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
