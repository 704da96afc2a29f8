"""What goes to an LLM provider and what comes back, independent of any vendor's wire format."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.domain.contracts import Message


class ToolSpec(BaseModel):
    """A tool the model may call: name, description and JSON Schema of its arguments."""

    model_config = ConfigDict(frozen=True)
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class LLMRequest(BaseModel):
    """One completion request."""

    model_config = ConfigDict(frozen=True)
    purpose: Literal["plan", "tool", "answer"] = "plan"
    system: str = ""
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    model: str | None = None
    temperature: float = 0.0
    #: nucleus sampling: the model samples only from the most likely tokens whose probabilities add up to
    #: this; None: the provider's setting (HARNESS_LLM_TOP_P), or the model's own default when that is unset
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int = 2_048
    stream: bool = False


class Usage(BaseModel):
    """Tokens used by one call and what they cost."""

    model_config = ConfigDict(frozen=True)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    #: the unit prices applied (USD per million tokens) and the price table's date; `priced` is False
    #: when the model had no price (cost_usd is then 0 and says nothing)
    input_per_mtok: float | None = None
    output_per_mtok: float | None = None
    price_table: str | None = None
    priced: bool = True


class ToolCallOut(BaseModel):
    """A tool call the model asked for."""

    model_config = ConfigDict(frozen=True)
    id: str
    name: str
    arguments: dict[str, Any]


class LLMResponse(BaseModel):
    """A completion: text content and/or tool calls, with usage."""

    model_config = ConfigDict(frozen=True)
    content: str = ""
    tool_calls: tuple[ToolCallOut, ...] = ()
    model: str
    provider: str
    finish_reason: str = "stop"
    usage: Usage = Usage()


class FallbackResponse(LLMResponse):
    """A response from the fallback model; says which model it stood in for and why."""

    fallback_from: str
    fallback_reason: str
