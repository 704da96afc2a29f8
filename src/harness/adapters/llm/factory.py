"""The real LLM providers by name; each SDK is imported only when its provider is chosen."""

from __future__ import annotations

from harness.adapters.llm.resilient import GuardedProvider, ProviderSettings
from harness.pipeline.resilience import BreakerRegistry
from harness.ports import Clock


def make_provider(kind: str, settings: ProviderSettings, *, clock: Clock | None = None,
                  breakers: BreakerRegistry | None = None) -> GuardedProvider:
    """The real provider named `kind` ("openai" or "anthropic"); its SDK is imported only when chosen,
    so the default install (scripted LLM) does not need either."""
    if kind == "openai":
        from harness.adapters.llm.openai_compat import OpenAICompatProvider

        return OpenAICompatProvider(settings, clock=clock, breakers=breakers)
    if kind == "anthropic":
        from harness.adapters.llm.anthropic import AnthropicProvider

        return AnthropicProvider(settings, clock=clock, breakers=breakers)
    raise ValueError(f"no real LLM provider named {kind!r}")
