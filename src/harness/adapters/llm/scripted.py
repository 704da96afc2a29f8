"""The scripted provider: deterministic answers from a readable rules file (the offline default).

A rules file is YAML::

    rules:
      - name: order_status                       # shown in traces
        when: '(?i)where is (my )?order (?P<order_id>[A-Z]-\\d+)'
        purpose: plan                            # plan (default), tool, answer or any
        round: 2                                 # plans: the round it answers (default: the first)
        results: '"status": "delivered"'        # matched against the latest round's results (optional)
        system: '\\[(?P<source>[^]]+)\\]'        # matched against the system prompt (optional): memory and
                                                 # knowledge-base snippets are there
        plan: {steps: [...], answer_template: "..."}   # answered as JSON content, or
        reply: "free text"                       # answered verbatim (e.g. to script an invalid plan)
        error: {kind: server_error, message: "..."}    # raise a ProviderError (to script failures)
    fallback:
      reply: "..."

The first rule whose `when` matches the task answers (and whose `results` and `system`, when given, match
too): the task is the last user message, not counting the messages that show the model a round's results.
Named groups of the `when`, `results` and `system` patterns are
substituted into every string of the plan or reply written as ``{group}``, and so is any result the
model has been shown, written as ``{output_key.field}`` (``{order.status}``): a later round's plan or
an answer from results can use what the earlier steps found, as a real model would.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.domain.errors import ProviderError
from harness.domain.llm import LLMRequest, LLMResponse, Usage
from harness.domain.plans import lookup_path
from harness.pipeline.rounds import RESULTS_HEADER
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
    purpose: Literal["plan", "tool", "answer", "any"] = "plan"
    round: int | None = Field(default=None, ge=1)
    results: str | None = None
    system: str | None = None
    plan: dict[str, Any] | None = None
    reply: str | None = None
    error: ScriptedError | None = None

    @field_validator("when", "results", "system")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is None:
            return None
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


_WHOLE = re.compile(r"^\{(\w+(?:\.\w+)*):(number|integer)\}$")


_PLACEHOLDER = re.compile(r"\{(\w+(?:\.\w+)*)\}")


def _substitute(value: Any, groups: dict[str, str], seen: dict[str, Any] | None = None) -> Any:
    """Put named groups, and results the model was shown (`{key.field}`), into strings; "{name:number}"
    alone becomes a number. A placeholder that names neither stays as written."""
    seen = seen or {}
    if isinstance(value, str):
        whole = _WHOLE.match(value)
        if whole:
            name = whole.group(1)
            try:
                raw = groups[name] if name in groups else lookup_path(seen, name)
            except KeyError:
                raw = None
            if raw is not None:
                return float(raw) if whole.group(2) == "number" else int(float(raw))

        def fill(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in groups:
                return groups[name]
            try:
                return str(lookup_path(seen, name))
            except KeyError:
                return match.group(0)
        return _PLACEHOLDER.sub(fill, value)
    if isinstance(value, dict):
        return {k: _substitute(v, groups, seen) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, groups, seen) for v in value]
    return value


def _conversation(request: LLMRequest) -> tuple[str, int, str, dict[str, Any]]:
    """(task, round, latest results text, every result shown) read from a request's messages."""
    task, round_no, latest, seen = "", 1, "", {}
    for message in request.messages:
        if message.role != "user":
            continue
        if message.content.startswith(RESULTS_HEADER):
            if message.content.startswith(f"{RESULTS_HEADER} "):
                round_no += 1
            latest = message.content
            body = message.content.split("\n", 1)[1].split("\n\n", 1)[0] if "\n" in message.content else ""
            try:
                shown = json.loads(body)
            except ValueError:
                shown = None
            if isinstance(shown, dict):
                seen.update(shown)
        else:
            task = message.content
    return task, round_no, latest, seen


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters a token) for the scripted provider's usage figures."""
    return max(1, (len(text) + 3) // 4)


class ScriptedProvider:
    """Answers from rules; same input, same answer, every time."""

    name = "scripted"
    #: it answers at once, in the process: a drive calls it without a thread hop
    waits_itself = True

    def __init__(self, rules: RulesFile, *, source: str = "<rules>") -> None:
        self.rules = rules
        self.source = source
        self._compiled = [(r, re.compile(r.when)) for r in rules.rules]

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedProvider:
        """Load a rules file; a broken one raises BadInputError naming the file and the field."""
        return cls(load_yaml_model(path, RulesFile, "scripted LLM rules"), source=str(path))

    def token_price(self, request: LLMRequest) -> tuple[float, float] | None:
        """USD per token in and out that a call costs: the rules' pricing (None when free)."""
        price = self.rules.pricing
        if not price.input_per_1k_usd and not price.output_per_1k_usd:
            return None
        return price.input_per_1k_usd / 1000, price.output_per_1k_usd / 1000

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Answer with the first matching rule's plan, reply or error."""
        prompt, round_no, latest, seen = _conversation(request)
        rule, groups = self._match(prompt, request.purpose, round_no, latest, request.system)
        if rule.error is not None:
            kind = rule.error.kind
            raise ProviderError(f"scripted {kind}: {rule.error.message}", kind=kind,
                                retryable=_RETRYABLE.get(kind, False))
        if rule.reply is not None:
            content = _substitute(rule.reply, groups, seen) if seen or rule.purpose == "answer" else rule.reply
        else:
            content = json.dumps(_substitute(rule.plan, groups, seen))
        prompt_text = request.system + "".join(m.content for m in request.messages)
        tokens_in, tokens_out = estimate_tokens(prompt_text), estimate_tokens(content)
        price = self.rules.pricing
        usage = Usage(input_tokens=tokens_in, output_tokens=tokens_out,
                      cost_usd=round((tokens_in * price.input_per_1k_usd + tokens_out * price.output_per_1k_usd) / 1000,
                                     8),
                      input_per_mtok=price.input_per_1k_usd * 1000, output_per_mtok=price.output_per_1k_usd * 1000,
                      price_table="scripted rules")
        return LLMResponse(content=content, model=f"scripted:{rule.name}", provider=self.name, usage=usage)

    def _match(self, prompt: str, purpose: str, round_no: int = 1, latest: str = "",
               system: str = "") -> tuple[Rule, dict[str, str]]:
        for rule, pattern in self._compiled:
            if rule.purpose not in (purpose, "any"):
                continue
            if purpose == "plan" and (rule.round or 1) != round_no:
                continue
            found = pattern.search(prompt)
            if not found:
                continue
            groups = {k: v for k, v in found.groupdict().items() if v is not None}
            if rule.results is not None:
                shown = re.search(rule.results, latest)
                if shown is None:
                    continue
                groups.update({k: v for k, v in shown.groupdict().items() if v is not None})
            if rule.system is not None:
                told = re.search(rule.system, system)
                if told is None:
                    continue
                groups.update({k: v for k, v in told.groupdict().items() if v is not None})
            return rule, groups
        if self.rules.fallback is not None:
            return self.rules.fallback, {}
        raise ProviderError(f"no scripted rule in {self.source} matches {prompt[:80]!r}", kind="client_error",
                            retryable=False)
