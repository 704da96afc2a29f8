"""What the real providers share: settings, error classification, retries, a breaker per model, fallback.

A real provider implements one thing, `_attempt(model, request)`: a single HTTP call with the SDK's own
retries off, its errors translated into ProviderError. `GuardedProvider.complete` wraps that in our
policy (SPEC T3):

- retry: network errors, 5xx, 429 and timeouts are retried with exponential backoff and jitter,
  honouring retry-after, within the per-call RetryQuota; everything else fails at once;
- breaker: one CircuitBreaker per model ("llm:<provider>:<model>"), counting only failures that say
  the model is unhealthy (after the retries) — a bad request says nothing about the model;
- fallback: when the model's breaker is open (or this call opened it) and a fallback model is
  configured, the fallback answers. The switch is reported in the response itself, as a
  `FallbackResponse` carrying `fallback_from` and `fallback_reason`, so the Run manager traces it
  with the call that used it. With no fallback, the caller gets ProviderError(kind="circuit_open").
"""

from __future__ import annotations

import email.utils
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.adapters.llm.pricing import PricingTable
from harness.adapters.llm.tool_formats import ToolNames, parse_tool_calls, plan_from_submit
from harness.clock import SystemClock
from harness.domain.errors import ProviderError
from harness.domain.llm import FallbackResponse, LLMRequest, LLMResponse, Usage
from harness.pipeline import waits
from harness.pipeline.resilience import (
    BreakerConfig,
    BreakerRegistry,
    BreakerState,
    CircuitOpenError,
    RetryQuota,
    retry_call,
)
from harness.ports import Clock

#: one line for each failed model call, retried or not, and each switch to the fallback model; the HTTP
#: client's own line for every request is left to DEBUG (harness.service.logs)
log = logging.getLogger("harness.llm")
#: the most characters of a provider's error message a log line carries
_LOGGED_MESSAGE = 300

UNHEALTHY = frozenset({"network_error", "server_error", "rate_limit", "timeout"})
_CONTEXT = re.compile(r"context.length|context window|prompt is too long|too many tokens|maximum context",
                      re.IGNORECASE)
_BILLING_CODES = frozenset({
    "insufficient_quota", "billing_hard_limit_reached", "contract_spend_limit_reached",
    "enforced_spend_limit_reached", "linked_organization_spend_limit_reached",
    "linked_organization_billing_unavailable",
})
_BILLING = re.compile(r"credit balance|billing|insufficient.quota|spend limit", re.IGNORECASE)


@dataclass(frozen=True)
class ProviderSettings:
    """One real provider's configuration (the API key is resolved by the caller, never logged)."""

    model: str
    api_key: str
    base_url: str | None = None
    fallback_model: str | None = None
    timeout_s: float = 60.0
    stream: bool = False
    plan_mode: Literal["json", "tool"] = "json"
    #: how a plan (plan_mode "json") is asked for: a JSON Schema response format the OpenAI way
    #: ("json_schema"), the llama.cpp way ("json_object" with a schema), or none
    plan_format: Literal["json_schema", "json_object", "none"] = "json_schema"
    #: describe the tools in the system prompt instead of sending them as tools (for a server whose chat
    #: template does not show a request's tools to the model)
    tools_in_prompt: bool = False
    #: the most tokens a completion may ask for (a small local context window holds prompt and answer)
    max_output_tokens: int | None = None
    #: the most steps the plan schema admits (a 135M model repeats a step when it may write several)
    plan_max_steps: int = 8
    #: nucleus sampling sent with every request that names none itself (LLMRequest.top_p); None: not sent
    top_p: float | None = None
    quota: RetryQuota = field(default_factory=RetryQuota)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    pricing: PricingTable = field(default_factory=PricingTable)

    def __repr__(self) -> str:
        return f"ProviderSettings(model={self.model!r}, base_url={self.base_url!r}, api_key=<hidden>)"

    def top_p_for(self, request: LLMRequest) -> float | None:
        """The top_p a request goes out with: its own, or this provider's; None: none is sent."""
        return request.top_p if request.top_p is not None else self.top_p


def retry_after_from(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait, from retry-after-ms or retry-after (seconds or an HTTP date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def status_error(provider: str, status: int, message: str, *, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> ProviderError:
    """Classify an HTTP error answer (SPEC T3) into a ProviderError with its kind and retryability."""
    text = f"{provider} HTTP {status}: {message}"
    wait = retry_after_from(headers or {})
    billing = (code or "") in _BILLING_CODES or bool(_BILLING.search(message))
    if status == 429 and not billing:
        return ProviderError(text, kind="rate_limit", retryable=True, retry_after=wait)
    if billing or status == 402:
        return ProviderError(text, kind="billing", retryable=False)
    if status in (401, 403):
        return ProviderError(text, kind="auth", retryable=False)
    if status == 408:
        return ProviderError(text, kind="timeout", retryable=True)
    if status == 413 or code == "context_length_exceeded" or (status == 400 and _CONTEXT.search(message)):
        return ProviderError(text, kind="context_length", retryable=False)
    if status >= 500:
        return ProviderError(text, kind="server_error", retryable=True, retry_after=wait)
    return ProviderError(text, kind="client_error", retryable=False)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.retryable


def _retry_after(exc: BaseException) -> float | None:
    return exc.retry_after if isinstance(exc, ProviderError) else None


def _unhealthy(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.kind in UNHEALTHY


def _kind(exc: BaseException) -> str:
    return exc.kind if isinstance(exc, ProviderError) else type(exc).__name__


def _brief(exc: BaseException) -> str:
    """An error's message for a log line: one line, bounded (a provider may answer with a page), and
    without control characters (the provider's text is not ours: no terminal escape reaches the log)."""
    text = "".join(c if c.isprintable() else " " for c in " ".join(str(exc).split()))
    return text if len(text) <= _LOGGED_MESSAGE else text[:_LOGGED_MESSAGE - 1] + "…"


class GuardedProvider:
    """Base of the real providers: retries, a breaker per model and the fallback model (module doc)."""

    name = "guarded"

    def __init__(self, settings: ProviderSettings, *, clock: Clock | None = None,
                 breakers: BreakerRegistry | None = None,
                 sleep: Callable[[float], None] = waits.sleep) -> None:
        self.settings = settings
        self.breakers = breakers or BreakerRegistry(clock or SystemClock(), settings.breaker)
        self.sleep = sleep

    def _attempt(self, model: str, request: LLMRequest) -> LLMResponse:
        """One call of `model`, errors translated; implemented by each provider."""
        raise NotImplementedError

    def token_price(self, request: LLMRequest) -> tuple[float, float] | None:
        """USD per token in and out at the dearest model the call may be served by (the one asked for, or
        the fallback); None when the model asked for has no price."""
        return self.settings.pricing.token_price(request.model or self.settings.model, self.settings.fallback_model)

    def breaker_name(self, model: str) -> str:
        """The registry key of a model's breaker."""
        return f"llm:{self.name}:{model}"

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer through the model's breaker with retries; fall back when the breaker is open."""
        primary = request.model or self.settings.model
        try:
            return self._guarded(primary, request)
        except CircuitOpenError:
            reason = f"circuit for {primary} is open"
        except ProviderError as exc:
            if self.breakers.get(self.breaker_name(primary)).state is not BreakerState.OPEN:
                raise
            reason = f"{exc.kind} opened the circuit for {primary}"
        fallback = self.settings.fallback_model
        if fallback is None or fallback == primary:
            raise ProviderError(f"{self.name}: {reason} and no fallback model is configured",
                                kind="circuit_open", retryable=False)
        # a call refused by an open circuit sends nothing and is not logged: the failure that opened it was
        log.debug("%s model %s: %s; the fallback model %s answers", self.name, primary, reason, fallback,
                  extra={"provider": self.name, "model": primary, "fallback_model": fallback})
        try:
            response = self._guarded(fallback, request)
        except CircuitOpenError as exc:
            raise ProviderError(f"{self.name}: {reason}; fallback {fallback} is open too",
                                kind="circuit_open", retryable=False) from exc
        return FallbackResponse(**response.model_dump(), fallback_from=primary, fallback_reason=reason)

    def _guarded(self, model: str, request: LLMRequest) -> LLMResponse:
        breaker = self.breakers.get(self.breaker_name(model), self.settings.breaker)
        attempts = 0

        def attempt() -> LLMResponse:
            nonlocal attempts
            attempts += 1
            return self._attempt(model, request)

        def retrying(exc: BaseException, attempt: int, wait_s: float) -> None:
            log.warning("%s model %s: call failed (%s), attempt %d, retried in %.2f s: %s", self.name, model,
                        _kind(exc), attempt, wait_s, _brief(exc),
                        extra={"provider": self.name, "model": model, "error_kind": _kind(exc), "attempt": attempt,
                               "retry_in_s": round(wait_s, 3)})

        was_open = breaker.state is BreakerState.OPEN
        try:
            return breaker.call(
                lambda: retry_call(attempt, self.settings.quota, retryable=_retryable, retry_after=_retry_after,
                                   sleep=self.sleep, on_retry=retrying),
                counts=_unhealthy,
            )
        except ProviderError as exc:
            opened = not was_open and breaker.state is BreakerState.OPEN
            log.warning("%s model %s: call failed (%s) after %d attempt%s: %s%s", self.name, model, exc.kind,
                        attempts, "s" if attempts != 1 else "", _brief(exc),
                        self._circuit_note(model, breaker.config.reset_timeout) if opened else "",
                        extra={"provider": self.name, "model": model, "error_kind": exc.kind, "attempts": attempts,
                               "circuit_opened": opened})
            raise

    def _circuit_note(self, model: str, reset_s: float) -> str:
        """What a failure that opened `model`'s circuit adds to its log line: for how long, and who answers."""
        fallback = self.settings.fallback_model
        answers = f", the fallback model {fallback} answers meanwhile" if fallback not in (None, model) else ""
        return f"; the circuit for {model} is open for {reset_s:g} s{answers}"

    def response(self, model: str, request: LLMRequest, names: ToolNames, *, content: str,
                 raw_calls: list[tuple[str, str, Any]], finish: str, served_by: str,
                 tokens: tuple[int, int]) -> LLMResponse:
        """An LLMResponse from what the provider decoded: tool calls mapped back to skill ids (unknown
        tools and non-object arguments refused), a submitted plan as content, usage priced by the
        configured table for the model that was asked for."""
        calls = parse_tool_calls(self.name, names, raw_calls)
        content, calls = plan_from_submit(request, content, calls)
        pricing = self.settings.pricing
        price = pricing.price_of(model)
        usage = Usage(input_tokens=tokens[0], output_tokens=tokens[1], cost_usd=pricing.cost(model, *tokens),
                      input_per_mtok=price.input_per_mtok if price else None,
                      output_per_mtok=price.output_per_mtok if price else None,
                      price_table=pricing.as_of, priced=price is not None)
        return LLMResponse(content=content, tool_calls=tuple(calls), model=served_by, provider=self.name,
                           finish_reason=finish, usage=usage)

