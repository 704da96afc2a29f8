"""History compression that keeps every key item or refuses (SPEC C3).

Key items are found by explicit, documented rules, never by a model's judgement:

- goal: the conversation's first user message, and any message that states one ("goal:", "task:",
  "objective:"); the Run's own task is not history and is always sent whole;
- constraint: a user or system message with a constraint word (must, never, only, at most, deadline, ...);
- tool_result: every tool message;
- hitl_decision: a message that records an approval, a rejection or a break-glass.

Compression keeps key items verbatim and in order, then the newest ordinary messages that still fit,
and replaces the rest with one short extractive digest. If the key items alone do not fit, or the
result does not contain every key item verbatim, the Run is refused: answering from a context that
lost a constraint or a decision is worse than not answering.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.context.errors import CompressionRefusedError
from harness.context.tokenizer import MESSAGE_OVERHEAD
from harness.domain.contracts import Message

Count = Callable[[str], int]

_GOAL = re.compile(r"^\s*(?:goal|task|objective|my goal is|i want to|i need to)\b", re.IGNORECASE)
_CONSTRAINT = re.compile(
    r"\b(?:must(?:n't| not)?|never|always|do not|don't|only|at most|at least|no more than|not exceed|"
    r"limit(?:ed)?|deadline|budget|required?|forbidden|not allowed|without|unless)\b", re.IGNORECASE)
_HITL = re.compile(r"\b(?:approved|rejected|denied|declined|approval|approver|break[- ]glass|hitl)\b",
                   re.IGNORECASE)
#: words of each dropped message the digest keeps
DIGEST_WORDS = 12
#: share of the history budget the digest may take
DIGEST_SHARE = 0.1


@dataclass(frozen=True)
class Compressed:
    """The history that will be sent, and what compression did to it."""

    messages: tuple[Message, ...]
    tokens_in: int
    tokens_out: int
    dropped: int
    key_items: int
    messages_in: int

    @property
    def saved(self) -> int:
        """Tokens the compression saved."""
        return self.tokens_in - self.tokens_out

    def report(self) -> dict[str, int]:
        """Counts for the trace and the assembled context."""
        return {"messages_in": self.messages_in, "messages_out": len(self.messages), "dropped": self.dropped,
                "key_items": self.key_items, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out}


def key_items(messages: Sequence[Message]) -> dict[int, str]:
    """Index -> kind of every key item in the history (see the module docstring for the rules)."""
    keys: dict[int, str] = {}
    first_user = next((i for i, m in enumerate(messages) if m.role == "user"), None)
    for i, m in enumerate(messages):
        if m.role == "tool":
            keys[i] = "tool_result"
        elif _HITL.search(m.content):
            keys[i] = "hitl_decision"
        elif i == first_user or (m.role == "user" and _GOAL.search(m.content)):
            keys[i] = "goal"
        elif m.role in ("user", "system") and _CONSTRAINT.search(m.content):
            keys[i] = "constraint"
    return keys


def cost(message: Message, count: Count) -> int:
    """Tokens one message takes in a chat request."""
    return count(message.content) + MESSAGE_OVERHEAD


def key_tokens(messages: Sequence[Message], count: Count) -> int:
    """Tokens the key items alone need."""
    return sum(cost(messages[i], count) for i in key_items(messages))


def compress(messages: Sequence[Message], budget: int, count: Count) -> Compressed:
    """Fit `messages` into `budget` tokens keeping every key item; CompressionRefusedError otherwise."""
    costs = [cost(m, count) for m in messages]
    total = sum(costs)
    if total <= budget:
        return Compressed(tuple(messages), total, total, 0, len(key_items(messages)), len(messages))
    keys = key_items(messages)
    needed = sum(costs[i] for i in keys)
    if needed > budget:
        raise CompressionRefusedError(_refusal(messages, keys, costs, budget))
    kept, used = set(keys), needed
    digest_room = min(int(budget * DIGEST_SHARE), budget - used)
    for i in reversed(range(len(messages))):
        if i not in kept and used + costs[i] <= budget - digest_room:
            kept.add(i)
            used += costs[i]
    dropped = [i for i in range(len(messages)) if i not in kept]
    digest = _digest([messages[i] for i in dropped], budget - used, count)
    out: list[Message] = []
    for i, message in enumerate(messages):
        if digest is not None and i == dropped[0]:
            out.append(digest)
        if i in kept:
            out.append(message)
    result = Compressed(tuple(out), total, sum(cost(m, count) for m in out), len(dropped), len(keys),
                        len(messages))
    _verify(messages, keys, result, budget)
    return result


def _digest(dropped: Sequence[Message], room: int, count: Count) -> Message | None:
    """One system message naming what was left out, with the first words of each dropped message."""
    header = f"[compressed: {len(dropped)} earlier messages omitted; their first words, oldest first:]"
    lines = [header]
    for message in dropped:
        words = message.content.split()
        gist = " ".join(words[:DIGEST_WORDS]) + (" ..." if len(words) > DIGEST_WORDS else "")
        candidate = [*lines, f"- {message.role}: {gist}"]
        if count("\n".join(candidate)) + MESSAGE_OVERHEAD > room:
            break
        lines = candidate
    text = "\n".join(lines)
    if count(text) + MESSAGE_OVERHEAD > room:
        return None
    return Message(role="system", content=text)


def _verify(original: Sequence[Message], keys: dict[int, str], result: Compressed, budget: int) -> None:
    """Independent check of the promise: every key item verbatim, in order, within the budget."""
    remaining = iter(result.messages)
    for i in sorted(keys):
        if not any(m is original[i] for m in remaining):
            raise CompressionRefusedError(f"compression would lose key item #{i} ({keys[i]})")
    if result.tokens_out > budget:
        raise CompressionRefusedError(f"compressed history takes {result.tokens_out} tokens of {budget}")


def _refusal(messages: Sequence[Message], keys: dict[int, str], costs: list[int], budget: int) -> str:
    used, lost = 0, []
    for i in sorted(keys):
        used += costs[i]
        if used > budget:
            lost.append(f"#{i} ({keys[i]})")
    needed = sum(costs[i] for i in keys)
    return (f"compression would lose key item(s) {', '.join(lost[:5])}{' ...' if len(lost) > 5 else ''}: "
            f"the {len(keys)} key items of the {len(messages)}-message history need {needed} tokens, "
            f"{budget} are left")
