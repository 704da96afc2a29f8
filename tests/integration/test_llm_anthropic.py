"""The Anthropic messages provider against a real local HTTP server speaking the messages API (SPEC P3, T3).

The official SDK talks to 127.0.0.1 over a socket: JSON bodies, named server-sent events (including
error events mid-stream), error statuses with retry-after. Retries sleep through a recorder and the
breakers run on a FakeClock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.llm.pricing import ModelPrice, PricingTable
from harness.adapters.llm.resilient import ProviderSettings
from harness.clock import FakeClock
from harness.config import build_runtime
from harness.domain.contracts import Message
from harness.domain.errors import ProviderError
from harness.domain.llm import FallbackResponse, LLMRequest, ToolSpec
from harness.pipeline.resilience import BreakerConfig, RetryQuota
from harness.settings import Settings
from tests.fakes import anthropic_api as api
from tests.fakes.server import Reply, ScriptedServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOOKUP = ToolSpec(name="orders.lookup", description="Look up an order.",
                  parameters={"type": "object", "properties": {"order_id": {"type": "string"}}})
ASK = LLMRequest(purpose="tool", system="be brief", tools=(LOOKUP,), messages=(
    Message(role="system", content="tenant t1"), Message(role="user", content="where is A-1?"),
    Message(role="assistant", content="checking"), Message(role="tool", content='{"status": "shipped"}'),
))
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
PRICES = PricingTable(models={"claude-test": ModelPrice(input_per_mtok=3.0, output_per_mtok=15.0)})


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A messages-API server on an ephemeral loopback port."""
    with ScriptedServer() as srv:
        yield srv


class Harness:
    """A provider pointed at the server, with recorded sleeps and a fake clock."""

    def __init__(self, server: ScriptedServer, **overrides: object) -> None:
        self.clock = FakeClock()
        self.sleeps: list[float] = []
        options: dict[str, object] = {"model": "claude-test", "api_key": "sk-ant-test",
                                      "base_url": server.origin, "pricing": PRICES,
                                      "quota": RetryQuota(max_attempts=3, backoff_s=0.01)}
        options.update(overrides)
        # imported here: the anthropic SDK takes ~1.5 s to import, which every pytest worker would pay while
        # collecting this module
        from harness.adapters.llm.anthropic import AnthropicProvider

        self.provider = AnthropicProvider(ProviderSettings(**options),  # type: ignore[arg-type]
                                          clock=self.clock, sleep=self.sleeps.append)


def fails(harness: Harness, request: LLMRequest = ASK) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        harness.provider.complete(request)
    return info.value


def test_message_with_tool_use_usage_and_cost(server: ScriptedServer) -> None:
    """Text and tool_use blocks come back as content and skill calls, usage priced by the table."""
    server.queue(api.message("Checking.", tool_uses=[("toolu_1", "orders__lookup", {"order_id": "A-1"})],
                             usage=(2000, 100)))
    response = Harness(server).provider.complete(ASK)
    assert response.content == "Checking." and response.finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("toolu_1", "orders.lookup", {"order_id": "A-1"})]
    assert response.usage.cost_usd == pytest.approx((2000 * 3.0 + 100 * 15.0) / 1e6)


def test_request_shape_follows_the_messages_api(server: ScriptedServer) -> None:
    """System text goes apart from the turns, tool output becomes user text, tools use input_schema."""
    server.queue(api.message("ok"))
    Harness(server).provider.complete(ASK)
    sent = server.received[0]
    assert sent.path == "/v1/messages" and "anthropic-version" in sent.headers
    assert sent.body["system"] == "be brief\n\ntenant t1"
    assert [m["role"] for m in sent.body["messages"]] == ["user", "assistant", "user"]
    assert sent.body["messages"][2]["content"].startswith("[tool output]")
    assert sent.body["tools"][0]["name"] == "orders__lookup" and "input_schema" in sent.body["tools"][0]
    assert sent.body["max_tokens"] == ASK.max_tokens


def test_sampling_parameters_the_messages_api_does_not_take_are_not_sent(server: ScriptedServer) -> None:
    """The messages API this SDK speaks takes no temperature or top_p: a request naming a top_p, or a
    provider set with one, still sends neither (the call succeeds instead of failing on the SDK)."""
    server.queue(api.message("a"))
    Harness(server, top_p=0.8).provider.complete(ASK.model_copy(update={"top_p": 0.5}))
    assert "top_p" not in server.received[0].body and "temperature" not in server.received[0].body


def test_streaming_assembles_text_tool_input_and_usage(server: ScriptedServer) -> None:
    """With streaming on, text deltas are joined, partial tool JSON reassembled, usage taken from
    message_start and message_delta; ping events are ignored."""
    server.queue(api.stream(["Check", "ing."], usage=(70, 12),
                            tool_uses=[("toolu_1", "orders__lookup", '{"order_id": "A-1"}')]))
    response = Harness(server, stream=True).provider.complete(ASK)
    assert response.content == "Checking."
    assert [(c.name, c.arguments) for c in response.tool_calls] == [("orders.lookup", {"order_id": "A-1"})]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (70, 12)
    assert server.received[0].body["stream"] is True


def test_429_waits_for_retry_after(server: ScriptedServer) -> None:
    """A rate-limit answer is retried after the server's retry-after, and the SDK itself never retries."""
    server.queue(api.error(429, "rate_limit_error", "Number of requests exceeded",
                           headers={"retry-after": "3"}), api.message("ok"))
    harness = Harness(server)
    assert harness.provider.complete(ASK).content == "ok"
    assert harness.sleeps == [3.0] and len(server.received) == 2
    assert server.received[0].headers["x-stainless-retry-count"] == "0"


@pytest.mark.parametrize("reply", [api.error(500, "api_error", "Internal server error"),
                                   api.error(529, "overloaded_error", "Overloaded"),
                                   api.stream_error("overloaded_error", "Overloaded")])
def test_server_errors_and_overload_are_retried(server: ScriptedServer, reply: Reply) -> None:
    """500, 529 and an overloaded error event inside a stream are retried, then the call succeeds."""
    server.queue(reply, api.stream(["recovered"]))
    harness = Harness(server, stream=True)
    assert harness.provider.complete(ASK).content == "recovered"
    assert len(server.received) == 2 and len(harness.sleeps) == 1


@pytest.mark.parametrize(("reply", "kind"), [
    (api.error(401, "authentication_error", "invalid x-api-key"), "auth"),
    (api.error(403, "permission_error", "not allowed"), "auth"),
    (api.error(400, "invalid_request_error", "prompt is too long: 212000 tokens > 200000 maximum"),
     "context_length"),
    (api.error(413, "request_too_large", "Request exceeds the maximum allowed number of bytes"),
     "context_length"),
    (api.error(400, "invalid_request_error", "Your credit balance is too low to access the Anthropic API"),
     "billing"),
    (api.error(402, "billing_error", "payment required"), "billing"),
    (api.error(404, "not_found_error", "model: claude-nope"), "client_error"),
])
def test_client_errors_fail_at_once(server: ScriptedServer, reply: Reply, kind: str) -> None:
    """Auth, context-length, billing and other 4xx answers are classified and never retried."""
    server.queue(reply, api.message("never reached"))
    harness = Harness(server)
    error = fails(harness)
    assert (error.kind, error.retryable) == (kind, False)
    assert len(server.received) == 1 and harness.sleeps == []


@pytest.mark.parametrize(("reply", "stream", "needle"), [
    (api.stream([], tool_uses=[("t1", "orders__lookup", '{"order_id": "A-')]), True, "not JSON"),
    (api.stream([], tool_uses=[("t1", "orders__lookup", '"A-1"')]), True, "not a JSON object"),
    (api.message(tool_uses=[("t1", "rm_rf", {})]), False, "rm_rf"),
    (api.message(tool_uses=[("t1", "orders__lookup", "A-1")]), False, "not a JSON object"),
    (Reply(200, raw=b"{not json"), False, "malformed"),
])
def test_malformed_answers_are_clear_errors_not_crashes(server: ScriptedServer, reply: Reply, stream: bool,
                                                        needle: str) -> None:
    """Broken tool input, invented tools and garbage bodies are non-retryable malformed_response errors."""
    server.queue(reply)
    error = fails(Harness(server, stream=stream))
    assert error.kind == "malformed_response" and not error.retryable and needle in str(error)


def test_plan_mode_tool_forces_submit_plan(server: ScriptedServer) -> None:
    """In plan_mode "tool" submit_plan is forced and its input becomes the plan content."""
    plan = {"steps": [{"id": "a", "tool_call": {"skill": "orders.lookup", "arguments": {}},
                       "output_key": "a"}]}
    server.queue(api.message(tool_uses=[("t1", "submit_plan", plan)]))
    response = Harness(server, plan_mode="tool").provider.complete(ASK.model_copy(update={"purpose": "plan"}))
    assert json.loads(response.content) == plan and response.tool_calls == ()
    assert server.received[0].body["tool_choice"] == {"type": "tool", "name": "submit_plan"}


def test_open_breaker_switches_to_the_fallback_model(server: ScriptedServer) -> None:
    """When overload opens the model's breaker the fallback model answers, marked as a fallback."""
    harness = Harness(server, fallback_model="claude-small", quota=RetryQuota(max_attempts=1),
                      breaker=BreakerConfig(failure_threshold=1))
    server.queue(api.error(529, "overloaded_error", "Overloaded"), api.message("small model here"))
    response = harness.provider.complete(ASK)
    assert isinstance(response, FallbackResponse) and response.fallback_from == "claude-test"
    assert [r.body["model"] for r in server.received] == ["claude-test", "claude-small"]


def test_a_run_planned_by_the_provider_records_its_cost(server: ScriptedServer, tmp_path: Path,
                                                        call_log: Path) -> None:
    """A Run planned through the Anthropic provider succeeds with one CostTrace priced by the table."""
    plan = {"steps": [{"id": "a", "tool_call": {"skill": "test.echo", "arguments": {"text": "hi"}},
                       "output_key": "a"}], "answer_template": "{a.text}"}
    server.queue(api.stream([json.dumps(plan)[:20], json.dumps(plan)[20:]], usage=(900, 60)))
    settings = Settings(db=str(tmp_path / "rt.db"), skills_dirs=(FIXTURES / "skills",),
                        policy_file=FIXTURES / "policy.yaml", identities_file=FIXTURES / "identities.yaml",
                        data_dir=tmp_path / "data")
    rt = build_runtime(settings, provider=Harness(server, stream=True).provider)
    try:
        result = rt.runs.create_run({"task": "echo hi", **TESS})
        assert result.state == "SUCCEEDED" and result.answer == "hi"
        rt.store.drain_all()
        costs = [r.data() for r in rt.store.trace_of(result.run_id) if r.kind == "cost"]
        assert [(c["source"], c["input_tokens"], c["output_tokens"]) for c in costs] == [
            ("llm:anthropic:plan", 900, 60)]
        assert costs[0]["usd"] == pytest.approx((900 * 3.0 + 60 * 15.0) / 1e6)
        assert server.received[0].body["tool_choice"] == {"type": "none"}
    finally:
        rt.close()
