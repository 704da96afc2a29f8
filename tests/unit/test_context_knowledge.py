"""Knowledge-base snippets in the assembled context: ranked, inside the token budget (the last one cut to
fit), filtered, named in the trace; a failed search degrades to none, traced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.context.secrets import SecretFilter
from harness.context.trace import KNOWLEDGE_DEGRADED, context_records
from harness.domain.chain import content_hash
from harness.domain.contracts import RunRequest
from harness.domain.llm import ToolSpec
from harness.knowledge.base import Snippet
from harness.knowledge.scope import KnowledgeScope
from harness.pipeline.context_assembler import KNOWLEDGE_HEADER, ContextAssembler

TOOLS = [ToolSpec(name="orders.lookup", description="Look up an order.",
                  parameters={"type": "object", "properties": {"order_id": {"type": "string"}}})]
LONG = " ".join(f"Refund rule {i}: a refund of this kind is allowed after the order was delivered." for i in range(12))


def snippet(n: int, content: str) -> Snippet:
    """A found chunk of the handbook."""
    return Snippet(f"doc:{n}", "doc", "handbook", "handbook.md", f"Rule {n}", content, content_hash(content), 1.0 / n)


class FoundKnowledge:
    """A knowledge base that finds the given snippets, best first, and remembers the scope it was asked in."""

    mode = "lexical"

    def __init__(self, found: list[Snippet] | Exception) -> None:
        self.found = found
        self.scopes: list[KnowledgeScope] = []

    def search(self, scope: KnowledgeScope, query: str, k: int) -> list[Snippet]:
        self.scopes.append(scope)
        if isinstance(self.found, Exception):
            raise self.found
        return self.found[:k]


def assembler(found: list[Snippet] | Exception, **options: Any) -> tuple[ContextAssembler, FoundKnowledge]:
    """An assembler over a knowledge base that finds `found`, reading the handbook as the support agent."""
    knowledge = FoundKnowledge(found)
    return ContextAssembler(knowledge=knowledge, knowledge_bases=("handbook",), agent_name="support",
                            secret_filter=SecretFilter(), **options), knowledge


def request(budget: int = 8_000) -> RunRequest:
    """Alice of tenant t1, team desk, asking for a refund."""
    return RunRequest(task="Refund 40 EUR for order A-1001", tenant_id="t1", user_id="alice", team_id="desk",
                      token_budget=budget)


def test_snippets_reach_the_system_prompt_best_first_and_are_named() -> None:
    """Each snippet is in the system prompt with its source, in rank order, searched in the caller's scope,
    and the context names each chunk given with its content hash."""
    found = [snippet(1, "Refunds up to 100 EUR need no approval."), snippet(2, "Refunds over 100 EUR need a lead.")]
    built, knowledge = assembler(found)
    ctx = built.assemble(request(), TOOLS)
    assert KNOWLEDGE_HEADER in ctx.system_prompt
    first, second = (ctx.system_prompt.index(f"[handbook.md § Rule {n}]") for n in (1, 2))
    assert first < second
    assert [(c.chunk_id, c.content_hash, c.trimmed) for c in ctx.knowledge] == [
        (s.chunk_id, s.content_hash, False) for s in found]
    assert knowledge.scopes == [KnowledgeScope("t1", ("handbook",), "support", "desk")]
    record = context_records("r1", ctx)[0].payload
    assert [c["chunk_id"] for c in record["knowledge"]] == ["doc:1", "doc:2"]


def test_snippets_count_against_the_budget_and_the_last_one_is_cut_to_fit() -> None:
    """With a small budget fewer snippets are given, the last cut at a word and marked trimmed, and the
    whole context stays inside the budget."""
    found = [snippet(n, LONG) for n in range(1, 6)]
    wide = assembler(found)[0].assemble(request(), TOOLS)
    narrow = assembler(found)[0].assemble(request(budget=1_400), TOOLS)
    assert len(narrow.knowledge) < len(wide.knowledge) and narrow.knowledge[-1].trimmed
    assert narrow.tokens_used <= narrow.token_budget and wide.tokens_used <= wide.token_budget
    assert sum(c.tokens for c in narrow.knowledge) <= int(1_400 * 0.25)
    assert narrow.system_prompt.rstrip().endswith("...")


def test_a_secret_in_a_snippet_never_reaches_the_model() -> None:
    """Chunks are stored filtered; they are filtered again as they are given, with the filter of the day."""
    ctx = assembler([snippet(1, "Deploy refunds with AKIAQ7CANARY4EXAMPLE1.")])[0].assemble(request(), TOOLS)
    assert "AKIAQ7CANARY4EXAMPLE1" not in ctx.system_prompt and ctx.filtered_secrets >= 1


def test_a_failed_search_degrades_to_no_snippets_and_says_so() -> None:
    """A knowledge base that is down leaves the Run without snippets, and the trace has an ErrorTrace."""
    ctx = assembler(RuntimeError("index is gone"))[0].assemble(request(), TOOLS)
    assert ctx.knowledge == () and ctx.knowledge_degraded == "RuntimeError: index is gone"
    records = context_records("r1", ctx)
    assert records[1].payload["error_code"] == KNOWLEDGE_DEGRADED


def test_an_agent_names_the_knowledge_bases_its_runs_read(tmp_path: Path) -> None:
    """`knowledge_bases` of an agent file (or `Agent(...)`) is what the context assembler searches, for that
    agent by name; a name that is not one is refused, naming the file and the field."""
    from harness.agents import Agent, support_agent
    from harness.config import build_runtime
    from harness.domain.errors import BadInputError
    from harness.settings import Settings

    assert support_agent().knowledge_bases == ("default", "handbook")
    agent = Agent(name="helpdesk", instructions="Help.", knowledge_bases=("faq",))
    rt = build_runtime(Settings(db=str(tmp_path / "a.db"), data_dir=tmp_path / "data"), agent=agent)
    try:
        assert (rt.runs.assembler.knowledge_bases, rt.runs.assembler.agent_name) == (("faq",), "helpdesk")
    finally:
        rt.close()
    (tmp_path / "agent.yaml").write_text("name: a\ninstructions: Help.\nknowledge_bases: ['two words']\n")
    with pytest.raises(BadInputError, match=r"agent.yaml: knowledge_bases\.0"):
        Agent.from_file(tmp_path / "agent.yaml")
