"""A budget cap holds before a model call, not only after it (SPEC G1).

The gatekeeper checks a plan against what was spent; a model call is checked here, before it is made,
against its worst case: its prompt as the context assembler counts it plus `max_tokens` of output, at the
dearest price the call may be served at (the model's, or its fallback's). When that does not fit what the
tightest cap (per Run, per user, per tenant) has left, the call is asked for fewer output tokens, as many
as still fit; when not even `MIN_OUTPUT_TOKENS` fit, the call is not made (BudgetExceededError names the
cap). So one call cannot take a budget past its cap.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from harness.domain.contracts import CallerIdentity
from harness.domain.errors import BudgetExceededError
from harness.domain.llm import LLMRequest

#: fewer output tokens than this is no useful answer: the call is refused instead
MIN_OUTPUT_TOKENS = 256
#: what each message adds to the prompt beyond its text (role and separators)
_MESSAGE_OVERHEAD = 4


@dataclass(frozen=True, slots=True)
class TokenPrice:
    """USD per token, in and out, of the dearest model a call may be served by."""

    input_usd: float
    output_usd: float


@dataclass(frozen=True, slots=True)
class Room:
    """What the tightest budget cap has left: its scope, its cap and what was spent against it."""

    scope: str
    cap_usd: float
    spent_usd: float

    @property
    def left_usd(self) -> float:
        """USD still available under the cap."""
        return self.cap_usd - self.spent_usd


class CallBudget:
    """Fits a model call to what the caller's budget caps have left, or refuses it."""

    def __init__(self, room: Callable[[CallerIdentity, str], Room | None],
                 price: Callable[[LLMRequest], TokenPrice | None], count: Callable[[str], int]) -> None:
        self.room = room
        self.price = price
        self.count = count

    def prompt_tokens(self, request: LLMRequest) -> int:
        """The request's prompt as the context assembler's tokenizer counts it (text, tools, overhead)."""
        texts = [request.system, *(m.content for m in request.messages)]
        tools = json.dumps([t.model_dump(mode="json") for t in request.tools]) if request.tools else ""
        return sum(self.count(t) for t in (*texts, tools) if t) + _MESSAGE_OVERHEAD * (len(request.messages) + 1)

    def fit(self, request: LLMRequest, caller: CallerIdentity, run_id: str) -> LLMRequest:
        """`request` unchanged when its worst case fits every cap (or no cap or no price applies), with
        fewer output tokens when only that fits; BudgetExceededError when not even MIN_OUTPUT_TOKENS do."""
        price = self.price(request)
        if price is None or (price.input_usd <= 0 and price.output_usd <= 0):
            return request
        room = self.room(caller, run_id)
        if room is None:
            return request
        prompt = self.prompt_tokens(request)
        worst = prompt * price.input_usd + request.max_tokens * price.output_usd
        if worst <= room.left_usd:
            return request
        affordable = int((room.left_usd - prompt * price.input_usd) / price.output_usd) \
            if price.output_usd > 0 else request.max_tokens
        if affordable < min(MIN_OUTPUT_TOKENS, request.max_tokens):
            raise BudgetExceededError(
                f"budget.per_{room.scope}: {room.scope} spent {room.spent_usd:.4f} + the model call's worst case "
                f"{worst:.4f} ({prompt} tokens in, {request.max_tokens} out) exceeds cap {room.cap_usd:.2f} USD; "
                "the call was not made")
        return request.model_copy(update={"max_tokens": affordable})
