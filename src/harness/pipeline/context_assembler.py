"""Context assembler (step ②, seed 004 §3.2): system prompt, history and user input within a token budget.

Side-effect free and retryable. The budget is checked before anything optional is added: history is
kept newest-first while it fits; if the system prompt, tool schemas and the task alone exceed the
budget the Run fails cleanly (ContextError) instead of sending a truncated task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from harness.adapters.llm.scripted import estimate_tokens
from harness.adapters.llm.types import ToolSpec
from harness.audit.chain import canonical_json
from harness.errors import ContextError
from harness.pipeline.contracts import AssembledContext, Message, RunRequest

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent running inside harness-kernel. Answer with a JSON plan: "
    '{"steps": [{"id", "goal", "tool_call": {"skill", "arguments"}, "depends_on", "output_key"}], '
    '"answer_template", "budget_estimate": {"tokens", "cost_usd"}}. Use only the tools listed. '
    'Pass earlier results with {"$ref": "<output_key>.<field>"}.'
)


class Tokenizer(Protocol):
    """Counts tokens the way the target model does."""

    def count(self, text: str) -> int:
        """Number of tokens in `text`."""
        ...


class ApproxTokenizer:
    """Four characters a token; used until a real tokenizer is configured."""

    def count(self, text: str) -> int:
        """Approximate number of tokens."""
        return estimate_tokens(text)


class ContextAssembler:
    """Builds the AssembledContext for a Run."""

    def __init__(self, tokenizer: Tokenizer | None = None, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> None:
        self.tokenizer: Tokenizer = tokenizer or ApproxTokenizer()
        self.system_prompt = system_prompt

    def assemble(self, request: RunRequest, tools: Sequence[ToolSpec]) -> AssembledContext:
        """Fit system prompt, tool schemas, task and as much recent history as the budget allows."""
        count = self.tokenizer.count
        fixed = (
            count(self.system_prompt)
            + count(canonical_json([t.model_dump() for t in tools]))
            + count(request.task)
        )
        if fixed > request.token_budget:
            raise ContextError(
                f"context needs {fixed} tokens for the system prompt, tool schemas and task alone; "
                f"the budget is {request.token_budget}"
            )
        used, kept = fixed, []
        for message in reversed(request.history):
            cost = count(message.content) + 4
            if used + cost > request.token_budget:
                break
            kept.append(message)
            used += cost
        history: tuple[Message, ...] = tuple(reversed(kept))
        return AssembledContext(
            system_prompt=self.system_prompt, history=history, user_input=request.task,
            tokens_used=used, token_budget=request.token_budget,
        )
