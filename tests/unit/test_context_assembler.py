"""The context assembler: clean, within budget, scoped memory, degrade on recall failure (SPEC C1-C4)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from harness.adapters.sql.memory import SqlMemoryRows
from harness.adapters.sql.store import SqlStore
from harness.context.errors import CompressionRefusedError, ScopeViolationError
from harness.context.secrets import SecretFilter
from harness.context.tokenizer import BpeTokenizer
from harness.domain.contracts import Message, RunRequest
from harness.domain.errors import ContextError
from harness.domain.llm import ToolSpec
from harness.memory.store import MemoryStore, NewMemory
from harness.pipeline.context_assembler import ContextAssembler

TOOLS = [ToolSpec(name="orders.lookup", description="Look up an order.",
                  parameters={"type": "object", "properties": {"order_id": {"type": "string"}}})]
FILTER = SecretFilter()


@pytest.fixture
def memory(store: SqlStore) -> MemoryStore:
    """A lexical memory store on the test database, with two users' notes in tenant t1."""
    mem = MemoryStore(SqlMemoryRows(store.engine), store.clock, FILTER)
    mem.add([NewMemory("t1", "user", "Alice prefers refunds as store credit in disputes", user_id="alice"),
             NewMemory("t1", "user", "Bob ships to Vienna; refunds go to his card", user_id="bob")])
    return mem


def request(**fields: object) -> RunRequest:
    """A request from alice in tenant t1 unless the test says otherwise."""
    return RunRequest.model_validate({"task": "Refund order A-1002", "tenant_id": "t1", "user_id": "alice",
                                      **fields})


def test_secrets_are_gone_from_every_part_the_model_sees(memory: MemoryStore) -> None:
    """System prompt, task and history are scrubbed before the context exists; the count is kept."""
    assembler = ContextAssembler(system_prompt="Ops key: AKIAQ7CANARY4EXAMPLE1", memory=memory)
    ctx = assembler.assemble(request(
        task="Refund order A-1002, my password is Canary-Hunter2!",
        history=[{"role": "tool", "content": "Cookie: sessionid=canarySess10n4242"}]), TOOLS)
    text = ctx.model_dump_json()
    for secret in ("AKIAQ7CANARY4EXAMPLE1", "Canary-Hunter2!", "canarySess10n4242"):
        assert secret not in text
    assert ctx.filtered_secrets == 3 and ctx.tokenizer == "cl100k_base"


def test_recall_is_confined_to_the_caller_and_rendered_for_the_model(memory: MemoryStore) -> None:
    """Alice's context holds her note, never Bob's, and the note is in the system prompt sent to the model."""
    ctx = ContextAssembler(memory=memory).assemble(request(), TOOLS)
    assert len(ctx.memory) == 1 and "store credit" in ctx.memory[0]
    assert "store credit" in ctx.system_prompt and "Vienna" not in ctx.system_prompt
    assert ctx.recall_mode == "lexical" and len(ctx.memory_ids) == 1


@pytest.mark.parametrize("asked", [{"tenant_id": "t2"}, {"user_id": "bob"}, {"session_id": "other"},
                                   {"team_id": "sales"}])
def test_asking_for_someone_elses_memory_is_a_hard_failure(memory: MemoryStore,
                                                            asked: dict[str, str]) -> None:
    """Naming another tenant, user, session or team raises; it is never narrowed to a quiet result."""
    with pytest.raises(ScopeViolationError, match="crosses the caller's"):
        ContextAssembler(memory=memory).assemble(request(memory=asked), TOOLS)


def test_a_failed_recall_degrades_to_no_memory(memory: MemoryStore, store: SqlStore) -> None:
    """A broken memory index does not fail the Run: no memory, and the context says why (for the trace)."""
    with store.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE memory_fts"))
    ctx = ContextAssembler(memory=memory).assemble(request(), TOOLS)
    assert ctx.memory == () and ctx.recall_degraded is not None and "memory_fts" in ctx.recall_degraded


def test_the_precheck_decides_how_deep_recall_goes(memory: MemoryStore) -> None:
    """With no room left after the fixed part and the history's key items, recall is skipped."""
    history = [{"role": "tool", "content": "result " * 130}]
    ctx = ContextAssembler(memory=memory).assemble(request(token_budget=420, history=history), TOOLS)
    assert ctx.memory == () and ctx.recall_mode.startswith("skipped")
    assert ctx.tokens_used <= 420


def test_the_fixed_part_over_budget_fails_before_anything_else() -> None:
    """System prompt, tools and task alone over the budget: ContextError naming the budget."""
    with pytest.raises(ContextError, match="the budget is 256"):
        ContextAssembler().assemble(request(task="echo " + "lorem ipsum " * 200, token_budget=256), TOOLS)


def test_key_items_that_cannot_fit_refuse_the_run() -> None:
    """A tool result too big for the budget is a key item: the Run is refused, not answered without it."""
    history = [Message(role="tool", content="row " * 2_000)]
    with pytest.raises(CompressionRefusedError):
        ContextAssembler().assemble(request(history=history, token_budget=1_000), TOOLS)


def test_a_long_history_is_compressed_within_budget(memory: MemoryStore) -> None:
    """A 50-turn history over budget is compressed; the total stays within the budget."""
    history = [{"role": "user" if i % 2 else "assistant", "content": f"turn {i}: " + "shipping detail " * 30}
               for i in range(50)]
    ctx = ContextAssembler(BpeTokenizer("o200k_base"), memory=memory).assemble(
        request(history=history, token_budget=3_000), TOOLS)
    assert ctx.tokens_used <= 3_000 and ctx.compression["dropped"] > 0
    assert ctx.compression["tokens_out"] < ctx.compression["tokens_in"]
