"""Canary secrets planted everywhere never reach the LLM provider (SPEC C4, with C2 and C5).

Canaries (AWS keys, GitHub tokens, JWTs, cookies, passwords, OAuth codes, ...) are planted in the
caller's history, in the task, in long-term memory written straight into the database (as an older
version or another tool might have left it) and in a tool result that a succeeded Run writes back.
The assertion is on what the provider actually received: every request through a recording wrapper
around the real ScriptedProvider, and every HTTP body the OpenAI-compatible provider sent to a local
server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.adapters.llm.openai_compat import OpenAICompatProvider
from harness.adapters.llm.pricing import ModelPrice, PricingTable
from harness.adapters.llm.resilient import ProviderSettings
from harness.adapters.llm.scripted import ScriptedProvider
from harness.adapters.sql import schema as t
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.llm import LLMRequest, LLMResponse
from harness.ports import LLMProvider
from harness.settings import Settings
from tests.fakes import openai_api as api
from tests.fakes.server import ScriptedServer
from tests.unit.test_context_secrets import CANARIES

from .checks import assert_audit_clean

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
SECRETS = [secret for _, _, secret in CANARIES]
PLANTED = " ".join(text for _, text, _ in CANARIES)
LEAK_PLAN = {"steps": [{"id": "a", "tool_call": {"skill": "test.leak", "arguments": {}}, "output_key": "a"}],
             "answer_template": "{a.title}: {a.note}"}
ECHO_PLAN = {"steps": [{"id": "a", "tool_call": {"skill": "test.echo", "arguments": {"text": "ok"}},
                        "output_key": "a"}], "answer_template": "{a.text}"}
RULES = {"rules": [{"name": "leak", "when": "^leak", "plan": LEAK_PLAN},
                   {"name": "canary", "when": "^echo canary check", "plan": ECHO_PLAN}]}


@dataclass
class RecordingProvider:
    """The real scripted provider, with every request it is asked kept for inspection."""

    inner: LLMProvider
    requests: list[LLMRequest] = field(default_factory=list)
    name: str = "scripted"

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Record the request, then answer it as the wrapped provider does."""
        self.requests.append(request)
        return self.inner.complete(request)


@pytest.fixture
def canary_settings(tmp_path: Path, call_log: Path) -> Settings:
    """Test skills plus `test.leak`, a read-only skill whose result is full of canaries."""
    skills = tmp_path / "canary_skills"
    skills.mkdir()
    (skills / "leak.yaml").write_text(
        "id: test.leak\nversion: 1.0.0\nentrypoint: leak_skills.py:leak\ninput_schema: {type: object}\n"
        "risk: {access: read, space: personal, impact: low}\n", encoding="utf-8")
    (skills / "leak_skills.py").write_text(
        f"def leak(args, ctx):\n    return {{'title': 'canary check results', 'note': {PLANTED!r}}}\n",
        encoding="utf-8")
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES), encoding="utf-8")  # JSON is YAML
    return Settings(db=str(tmp_path / "canary.db"), skills_dirs=(FIXTURES / "skills", skills),
                    policy_file=FIXTURES / "policy.yaml", llm_rules=rules,
                    identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data")


def plant_raw_memory(rt: Runtime) -> str:
    """A memory row holding canaries, written around the store's own scrubbing (an old or foreign writer)."""
    with rt.store.engine.begin() as conn:
        conn.execute(t.memory_entries.insert().values(
            entry_id="raw-canary", tenant_id="t1", scope="user", user_id="tess", kind="note",
            content=f"canary check notes from an old import: {PLANTED}", content_hash="-", created_at=0.0))
    return "raw-canary"


def history() -> list[dict[str, str]]:
    """Canaries in every role of the conversation so far."""
    return [{"role": "user", "content": f"here is everything: {PLANTED}"},
            {"role": "assistant", "content": f"noted {CANARIES[0][1]} and {CANARIES[5][1]}"},
            {"role": "tool", "content": json.dumps({"headers": {"Cookie": CANARIES[6][1]}, "body": PLANTED})}]


def drive_canary_runs(rt: Runtime) -> tuple[str, str]:
    """A Run whose tool result holds canaries (written back), then a Run with canaries everywhere else."""
    first = rt.runs.create_run({"task": "leak", **TESS})
    assert first.state == "SUCCEEDED", first.error
    raw = plant_raw_memory(rt)
    second = rt.runs.create_run({"task": f"echo canary check, my password is {SECRETS[8]}", **TESS,
                                 "history": history()})
    assert second.state == "SUCCEEDED", second.error
    recalled = rt.runs.assembled_context(second.run_id).memory_ids
    assert raw in recalled and rt.runs.assembler.memory is not None
    assert rt.runs.assembler.memory.entries_of_run(first.run_id)[0] in recalled  # the tool result came back
    return first.run_id, second.run_id


def assert_no_canary(sent: str) -> None:
    """No canary, nor its secret part, in what was sent; the planted text did arrive, redacted."""
    leaked = [secret for secret in SECRETS if secret in sent]
    assert not leaked, f"canaries reached the provider: {leaked}"
    assert "[REDACTED:" in sent


def test_canaries_never_reach_the_scripted_provider(canary_settings: Settings) -> None:
    """Through history, task, raw memory and a written-back tool result, no canary is in any request."""
    provider = RecordingProvider(ScriptedProvider.from_file(canary_settings.llm_rules))
    rt = build_runtime(canary_settings, clock=FakeClock(), provider=provider)
    try:
        drive_canary_runs(rt)
        assert len(provider.requests) == 2
        assert_no_canary("\n".join(r.model_dump_json() for r in provider.requests))
        with rt.store.engine.connect() as conn:
            stored = conn.execute(sa.select(t.memory_entries.c.content)
                                  .where(t.memory_entries.c.entry_id != "raw-canary")).scalars().all()
        assert stored and not [s for s in SECRETS if any(s in c for c in stored)]  # written back clean
        assert_audit_clean(rt)
    finally:
        rt.close()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A chat-completions server on an ephemeral loopback port."""
    with ScriptedServer() as srv:
        yield srv


def test_canaries_never_reach_the_openai_compatible_server(canary_settings: Settings,
                                                           server: ScriptedServer) -> None:
    """The same Runs through the real OpenAI-compatible provider: no canary in any HTTP body it sent."""
    server.queue(api.completion(json.dumps(LEAK_PLAN)), api.completion(json.dumps(ECHO_PLAN)))
    prices = PricingTable(models={"gpt-test": ModelPrice(input_per_mtok=1.0, output_per_mtok=2.0)})
    provider = OpenAICompatProvider(ProviderSettings(model="gpt-test", api_key="test-key", pricing=prices,
                                                     base_url=f"{server.origin}/v1"), clock=FakeClock())
    rt = build_runtime(canary_settings, clock=FakeClock(), provider=provider)
    try:
        drive_canary_runs(rt)
        assert len(server.received) == 2
        assert_no_canary("\n".join(json.dumps(r.body) for r in server.received))
    finally:
        rt.close()


def test_canaries_in_an_earlier_result_never_reach_an_llm_tool(canary_settings: Settings, tmp_path: Path) -> None:
    """A tool result full of canaries, passed by $ref into an LLM-as-a-tool prompt, reaches the model
    redacted: the tool controller applies the same secret filter as the context assembler (C4, T4)."""
    skills = Path(canary_settings.skills_dirs[1])
    (skills / "summarise.yaml").write_text(
        "id: test.summarise\nversion: 1.0.0\nkind: llm\n"
        "prompt: 'Summarise: {text}'\noutput: text\ninput_schema: {type: object}\n"
        "risk: {access: read, space: personal, impact: low}\n", encoding="utf-8")
    plan = {"steps": [
        {"id": "a", "tool_call": {"skill": "test.leak", "arguments": {}}, "output_key": "a"},
        {"id": "b", "tool_call": {"skill": "test.summarise", "arguments": {"text": {"$ref": "a.note"}}},
         "depends_on": ["a"], "output_key": "b"}], "answer_template": "{b.text}"}
    rules = {"rules": [{"name": "relay", "when": "^relay", "plan": plan},
                       {"name": "summary", "when": "^Summarise: ", "purpose": "tool", "reply": "summarised"}]}
    Path(canary_settings.llm_rules).write_text(json.dumps(rules), encoding="utf-8")
    provider = RecordingProvider(ScriptedProvider.from_file(canary_settings.llm_rules))
    rt = build_runtime(canary_settings, clock=FakeClock(), provider=provider)
    try:
        result = rt.runs.create_run({"task": "relay", **TESS})
        assert result.state == "SUCCEEDED", result.error
        tool_requests = [r for r in provider.requests if r.purpose == "tool"]
        assert len(tool_requests) == 1
        assert_no_canary(tool_requests[0].model_dump_json())
    finally:
        rt.close()
