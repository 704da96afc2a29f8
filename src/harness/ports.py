"""Ports: the small interfaces through which the kernel reaches what varies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from harness.adapters.llm.types import LLMRequest, LLMResponse
    from harness.pipeline.contracts import RunResult


class Clock(Protocol):
    """Where time comes from; inject a FakeClock to test timeouts without sleeping."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class LLMProvider(Protocol):
    """A language model behind one interface (SPEC P3); errors are harness ProviderErrors."""

    name: str

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer one request."""
        ...


class ResultSink(Protocol):
    """Where a Run's result goes when it is final or waits for a human (SPEC P4)."""

    def deliver(self, result: RunResult) -> None:
        """Hand the result to the caller."""
        ...
