"""LLM providers behind one port (SPEC P3): scripted (offline default), OpenAI-compatible, Anthropic."""

from harness.domain.llm import LLMRequest, LLMResponse, ToolSpec, Usage

__all__ = ["LLMRequest", "LLMResponse", "ToolSpec", "Usage"]
