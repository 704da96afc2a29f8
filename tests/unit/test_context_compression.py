"""History compression keeps every key item or refuses (SPEC C3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.context.compression import compress, cost, key_items
from harness.context.errors import CompressionRefusedError
from harness.context.tokenizer import BpeTokenizer
from harness.domain.contracts import Message

COUNT = BpeTokenizer("cl100k_base").count
CHATTER = ("Thanks, that helps. Could you also explain how the shipping estimate is computed for parcels "
           "that leave the warehouse late in the afternoon, and whether weekends count?")


def long_conversation(turns: int = 50) -> list[Message]:
    """A support conversation with a goal, constraints, tool results and an approval among chatter."""
    messages = [Message(role="user", content="Goal: get a refund for order A-1002, which arrived broken.")]
    for i in range(1, turns):
        if i == 7:
            messages.append(Message(role="user", content="The refund must not exceed 40 EUR."))
        elif i == 19:
            result = '{"order_id": "A-1002", "total": 38.0, "status": "delivered"}'
            messages.append(Message(role="tool", content=result))
        elif i == 31:
            messages.append(Message(role="system", content="Refund draft R-77 approved by lee (L3)."))
        elif i % 2:
            messages.append(Message(role="assistant", content=f"Step {i}: " + CHATTER))
        else:
            messages.append(Message(role="user", content=f"Question {i}: " + CHATTER))
    return messages


def test_key_items_are_found_by_the_documented_rules() -> None:
    """The opening goal, a constraint, a tool result and an approval are key; chatter is not."""
    kinds = key_items(long_conversation())
    assert kinds == {0: "goal", 7: "constraint", 19: "tool_result", 31: "hitl_decision"}


def test_a_history_that_fits_is_sent_unchanged() -> None:
    """Compression only acts when it must: a history within budget is passed through as is."""
    history = long_conversation(6)
    out = compress(history, 10_000, COUNT)
    assert out.messages == tuple(history) and out.saved == 0 and out.dropped == 0


def test_a_long_conversation_keeps_every_key_item_verbatim_and_in_order() -> None:
    """Fifty turns squeezed into a quarter of their size still carry goal, constraint, result and approval."""
    history = long_conversation()
    total = sum(cost(m, COUNT) for m in history)
    out = compress(history, total // 4, COUNT)
    assert out.tokens_out <= total // 4 and out.saved > total // 2
    kept = [m for m in out.messages if any(m is h for h in history)]
    keys = [history[i] for i in sorted(key_items(history))]
    assert [m for m in kept if m in keys] == keys
    assert out.messages[-1] is history[-1]  # the newest turns survive for coherence
    assert out.messages[0] is history[0]  # the goal, then a digest standing where messages were dropped
    assert out.messages[1].role == "system" and "omitted" in out.messages[1].content


def test_when_key_items_cannot_fit_the_run_is_refused() -> None:
    """A budget smaller than the key items is a refusal naming what would be lost, not a silent cut."""
    history = long_conversation()
    keys = sum(cost(history[i], COUNT) for i in key_items(history))
    with pytest.raises(CompressionRefusedError, match=r"would lose key item\(s\) #"):
        compress(history, keys - 1, COUNT)


messages = st.lists(
    st.builds(Message, role=st.sampled_from(["user", "assistant", "tool", "system"]),
              content=st.sampled_from([CHATTER, "You must stay under 10 EUR.", '{"ok": true}', "fine",
                                       "approved by pat", "Goal: close ticket T-9", "What about weekends?"])),
    min_size=0, max_size=40)


@settings(max_examples=150, deadline=None)
@given(history=messages, budget=st.integers(min_value=0, max_value=1_500))
def test_compression_keeps_every_key_item_or_refuses(history: list[Message], budget: int) -> None:
    """For any history and budget: every key item verbatim and in order within the budget, or a refusal."""
    try:
        out = compress(history, budget, COUNT)
    except CompressionRefusedError:
        assert sum(cost(history[i], COUNT) for i in key_items(history)) > budget or budget < 0
        return
    assert out.tokens_out <= budget
    remaining = iter(out.messages)
    for i in sorted(key_items(history)):
        assert any(m is history[i] for m in remaining)
