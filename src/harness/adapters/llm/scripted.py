"""The scripted provider: deterministic answers from a readable rules file (the offline default).

A rules file is YAML::

    rules:
      - name: order_status                       # shown in traces
        when: '(?i)where is (my )?order (?P<order_id>[A-Z]-\\d+)'
        purpose: plan                            # plan (default) or tool
        plan: {steps: [...], answer_template: "..."}   # answered as JSON content, or
        reply: "free text"                       # answered verbatim (e.g. to script an invalid plan)
        error: {kind: server_error, message: "..."}    # raise a ProviderError (to script failures)
    fallback:
      reply: "..."

The first rule whose `when` matches the last user message answers. Named groups of the pattern are
substituted into every string of the plan written as ``{group}``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.adapters.llm.types import LLMRequest, LLMResponse, Usage
from harness.errors import ProviderError
from harness.yamlfile import load_yaml_model

_RETRYABLE = {"network_error": True, "server_error": True, "rate_limit": True}


class ScriptedError(BaseModel):
    """A scripted provider failure."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["network_error", "server_error", "rate_limit", "client_error", "auth", "billing",
                  "context_length", "timeout"]
    message: str = "scripted failure"


class Rule(BaseModel):
    """One scripted rule."""

    model_config = ConfigDict(extra="forbid")
    name: str
    when: str
    purpose: Literal["plan", "tool", "any"] = "plan"
    plan: dict[str, Any] | None = None
    reply: str | None = None
    error: ScriptedError | None = None

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value

    def model_post_init(self, _context: Any) -> None:
        """Exactly one of plan, reply and error."""
        given = [k for k in ("plan", "reply", "error") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"rule {self.name!r} needs exactly one of plan, reply, error (got {given or 'none'})")


class Pricing(BaseModel):
    """What the scripted model charges, so budgets can be exercised offline."""

    model_config = ConfigDict(extra="forbid")
    input_per_1k_usd: float = Field(default=0.0, ge=0)
    output_per_1k_usd: float = Field(default=0.0, ge=0)


class RulesFile(BaseModel):
    """The whole rules file."""

    model_config = ConfigDict(extra="forbid")
    rules: list[Rule] = Field(default_factory=list)
    fallback: Rule | None = None
    pricing: Pricing = Pricing()

    @field_validator("fallback", mode="before")
    @classmethod
    def _fallback_matches_all(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {"name": "fallback", "when": "", "purpose": "any", **value}
        return value


_WHOLE = re.compile(r"^\{(\w+):(number|integer)\}$")


def _substitute(value: Any, groups: dict[str, str]) -> Any:
    """Put named groups into strings; "{name:number}" alone becomes a number."""
    if isinstance(value, str):
        whole = _WHOLE.match(value)
        if whole and whole.group(1) in groups:
            raw = groups[whole.group(1)]
            return float(raw) if whole.group(2) == "number" else int(raw)
        return re.sub(r"\{(\w+)\}", lambda m: groups.get(m.group(1), m.group(0)), value)
    if isinstance(value, dict):
        return {k: _substitute(v, groups) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, groups) for v in value]
    return value


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters a token) for the scripted provider's usage figures."""
    return max(1, (len(text) + 3) // 4)


class ScriptedProvider:
    """Answers from rules; same input, same answer, every time."""

    name = "scripted"

    def __init__(self, rules: RulesFile, *, source: str = "<rules>") -> None:
        self.rules = rules
        self.source = source
        self._compiled = [(r, re.compile(r.when)) for r in rules.rules]

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedProvider:
        """Load a rules file; a broken one raises BadInputError naming the file and the field."""
        return cls(load_yaml_model(path, RulesFile, "scripted LLM rules"), source=str(path))

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer with the first matching rule's plan, reply or error."""
        prompt = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
        rule, groups = self._match(prompt, request.purpose)
        if rule.error is not None:
            kind = rule.error.kind
            raise ProviderError(f"scripted {kind}: {rule.error.message}", kind=kind,
                                retryable=_RETRYABLE.get(kind, False))
        content = rule.reply if rule.reply is not None else json.dumps(_substitute(rule.plan, groups))
        prompt_text = request.system + "".join(m.content for m in request.messages)
        tokens_in, tokens_out = estimate_tokens(prompt_text), estimate_tokens(content)
        price = self.rules.pricing
        usage = Usage(input_tokens=tokens_in, output_tokens=tokens_out,
                      cost_usd=round((tokens_in * price.input_per_1k_usd + tokens_out * price.output_per_1k_usd) / 1000,
                                     8),
                      input_per_mtok=price.input_per_1k_usd * 1000, output_per_mtok=price.output_per_1k_usd * 1000,
                      price_table="scripted rules")
        return LLMResponse(content=content, model=f"scripted:{rule.name}", provider=self.name, usage=usage)

    def _match(self, prompt: str, purpose: str) -> tuple[Rule, dict[str, str]]:
        for rule, pattern in self._compiled:
            if rule.purpose not in (purpose, "any"):
                continue
            found = pattern.search(prompt)
            if found:
                return rule, {k: v for k, v in found.groupdict().items() if v is not None}
        if self.rules.fallback is not None:
            return self.rules.fallback, {}
        raise ProviderError(f"no scripted rule in {self.source} matches {prompt[:80]!r}", kind="client_error",
                            retryable=False)
