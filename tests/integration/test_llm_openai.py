"""The OpenAI-compatible provider against a real local HTTP server speaking chat completions (SPEC P3, T3).

The official SDK talks to 127.0.0.1 over a socket: JSON and server-sent-event bodies, error statuses
with retry-after headers, slow answers. Retries sleep through a recorder, the breakers run on a
FakeClock, so nothing here waits for real except the one timeout test.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.llm.openai_compat import OpenAICompatProvider
from harness.adapters.llm.pricing import ModelPrice, PricingTable
from harness.adapters.llm.resilient import GuardedProvider, ProviderSettings
from harness.clock import FakeClock
from harness.config import build_runtime
from harness.domain.contracts import Message
from harness.domain.errors import InvalidRequestError, ProviderError
from harness.domain.llm import FallbackResponse, LLMRequest, ToolSpec
from harness.pipeline.drive_loop import DriveLoop
from harness.pipeline.resilience import BreakerConfig, BreakerState, RetryQuota
from harness.replay.runner import replay
from harness.service.logs import HTTP_CLIENT_LOGGERS, ROUTINE_AT_INFO
from harness.settings import Settings
from tests.fakes import openai_api as api
from tests.fakes.server import Reply, ScriptedServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOOKUP = ToolSpec(name="orders.lookup", description="Look up an order.",
                  parameters={"type": "object", "properties": {"order_id": {"type": "string"}}})
ASK = LLMRequest(purpose="tool", system="be brief", messages=(Message(role="user", content="where is A-1?"),),
                 tools=(LOOKUP,))
#: both models priced: the test policy denies unpriced models, so an unpriced fallback would reject the Run
PRICES = PricingTable(models={"gpt-test": ModelPrice(input_per_mtok=2.0, output_per_mtok=8.0),
                              "gpt-small": ModelPrice(input_per_mtok=0.5, output_per_mtok=1.0)})


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A chat-completions server on an ephemeral loopback port."""
    with ScriptedServer() as srv:
        yield srv


class Harness:
    """A provider pointed at the server, with recorded sleeps and a fake clock."""

    def __init__(self, server: ScriptedServer | None, **overrides: object) -> None:
        self.clock = FakeClock()
        self.sleeps: list[float] = []
        options: dict[str, object] = {"model": "gpt-test", "api_key": "sk-test",
                                      "base_url": f"{server.origin}/v1" if server else None,
                                      "quota": RetryQuota(max_attempts=3, backoff_s=0.01), "pricing": PRICES}
        options.update(overrides)
        self.provider = OpenAICompatProvider(ProviderSettings(**options),  # type: ignore[arg-type]
                                             clock=self.clock, sleep=self.sleeps.append)


def fails(harness: Harness, request: LLMRequest = ASK) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        harness.provider.complete(request)
    return info.value


def test_completion_with_usage_cost_and_tools_in_openai_format(server: ScriptedServer) -> None:
    """Content and usage come back priced by the table; tools go out as functions with legal names."""
    server.queue(api.completion("On its way.", usage=(1000, 500)))
    response = Harness(server).provider.complete(ASK)
    assert response.content == "On its way." and response.provider == "openai"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (1000, 500)
    assert response.usage.cost_usd == pytest.approx((1000 * 2.0 + 500 * 8.0) / 1e6)
    sent = server.received[0]
    assert sent.path == "/v1/chat/completions" and sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body["messages"][0] == {"role": "system", "content": "be brief"}
    assert sent.body["tools"][0]["function"]["name"] == "orders__lookup"
    assert "stream" not in sent.body and "tool_choice" not in sent.body


def test_top_p_reaches_the_wire_from_the_request_or_the_settings(server: ScriptedServer) -> None:
    """A request's top_p is sent; without one the provider's setting is; with neither none is."""
    server.queue(api.completion("a"), api.completion("b"), api.completion("c"))
    Harness(server, top_p=0.8).provider.complete(ASK.model_copy(update={"top_p": 0.5}))
    Harness(server, top_p=0.8).provider.complete(ASK)
    Harness(server).provider.complete(ASK)
    assert [r.body.get("top_p") for r in server.received] == [0.5, 0.8, None]


def test_tool_calls_map_back_to_skill_ids(server: ScriptedServer) -> None:
    """A tool call on the wire name comes back as a call of the skill with decoded arguments."""
    server.queue(api.completion(None, tool_calls=[("call_1", "orders__lookup", '{"order_id": "A-1"}')],
                                finish="tool_calls"))
    response = Harness(server).provider.complete(ASK)
    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_1", "orders.lookup", {"order_id": "A-1"})]
    assert response.finish_reason == "tool_calls" and response.content == ""


def test_streaming_assembles_content_tool_calls_and_usage(server: ScriptedServer) -> None:
    """With streaming on, deltas are joined, split tool arguments reassembled, and usage read from the
    final chunk the provider asked for with include_usage."""
    server.queue(api.stream(["On ", "its ", "way."], usage=(40, 9),
                            tool_calls=[("call_1", "orders__lookup", '{"order_id": "A-1"}')]))
    response = Harness(server, stream=True).provider.complete(ASK)
    assert response.content == "On its way."
    assert [(c.name, c.arguments) for c in response.tool_calls] == [("orders.lookup", {"order_id": "A-1"})]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (40, 9)
    assert server.received[0].body["stream"] is True
    assert server.received[0].body["stream_options"] == {"include_usage": True}


def test_streaming_can_be_asked_per_request(server: ScriptedServer) -> None:
    """LLMRequest.stream turns streaming on for one call even when the provider default is off."""
    server.queue(api.stream(["ok"]))
    assert Harness(server).provider.complete(ASK.model_copy(update={"stream": True})).content == "ok"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_call_from_a_drive_on_a_drive_loop_reads_the_same_answer_and_sends_the_same_body(
        server: ScriptedServer, stream: bool) -> None:
    """On a drive loop the drive switches out while the asynchronous client waits: the answer (whole or
    streamed) is read the same as from the blocking client, and the body on the wire is the same."""
    bodies = []
    for on_loop in (False, True):
        reply = (api.stream(["On ", "its ", "way."], usage=(40, 9),
                            tool_calls=[("call_1", "orders__lookup", '{"order_id": "A-1"}')]) if stream
                 else api.completion("On its way.", usage=(40, 9),
                                     tool_calls=[("call_1", "orders__lookup", '{"order_id": "A-1"}')]))
        server.queue(reply)
        provider = Harness(server, stream=stream).provider
        if on_loop:
            provider.client.close()  # the blocking client is not what a drive on a loop uses
            drives = DriveLoop(concurrency=2, name="openai-test")
            try:
                response = drives.submit(functools.partial(provider.complete, ASK)).result(timeout=20)
                provider.close()
            finally:
                drives.stop()
        else:
            response = provider.complete(ASK)
            provider.close()
        assert response.content == "On its way."
        assert [(c.name, c.arguments) for c in response.tool_calls] == [("orders.lookup", {"order_id": "A-1"})]
        assert (response.usage.input_tokens, response.usage.output_tokens) == (40, 9)
        bodies.append(server.received[-1].body)
    assert bodies[0] == bodies[1]
    assert bodies[0].get("stream", False) is stream


def test_429_is_retried_after_the_servers_retry_after(server: ScriptedServer) -> None:
    """A 429 with retry-after: 1.5 waits 1.5 s (not the tiny backoff) and then succeeds."""
    server.queue(api.error(429, "Rate limit reached", code="rate_limit_exceeded",
                           headers={"retry-after": "1.5"}), api.completion("ok"))
    harness = Harness(server)
    assert harness.provider.complete(ASK).content == "ok"
    assert harness.sleeps == [1.5] and len(server.received) == 2
    assert server.received[0].headers["x-stainless-retry-count"] == "0"  # the SDK itself did not retry


def test_retry_after_ms_is_understood(server: ScriptedServer) -> None:
    """OpenAI's retry-after-ms header is read in milliseconds."""
    server.queue(api.error(429, "slow down", headers={"retry-after-ms": "250"}), api.completion("ok"))
    harness = Harness(server)
    harness.provider.complete(ASK)
    assert harness.sleeps == [0.25]


def test_500_is_retried_until_the_quota_is_spent(server: ScriptedServer) -> None:
    """5xx answers are retried; after max_attempts the error is a retryable server_error."""
    server.queue(api.error(500, "oops", kind="server_error"), api.completion("recovered"))
    assert Harness(server).provider.complete(ASK).content == "recovered"
    server.queue(*[api.error(503, "down", kind="server_error")] * 3)
    error = fails(Harness(server))
    assert error.kind == "server_error" and error.retryable and len(server.received) == 5


@pytest.mark.parametrize(("reply", "kind"), [
    (api.error(401, "Incorrect API key provided", code="invalid_api_key"), "auth"),
    (api.error(400, "This model's maximum context length is 8192 tokens", code="context_length_exceeded"),
     "context_length"),
    (api.error(429, "You exceeded your current quota", kind="insufficient_quota", code="insufficient_quota"),
     "billing"),
    (api.error(404, "The model `gpt-nope` does not exist", code="model_not_found"), "client_error"),
])
def test_client_errors_fail_at_once(server: ScriptedServer, reply: Reply, kind: str) -> None:
    """401, context-length, quota and other 4xx answers are not retried and say what they are."""
    server.queue(reply, api.completion("never reached"))
    harness = Harness(server)
    error = fails(harness)
    assert (error.kind, error.retryable) == (kind, False)
    assert len(server.received) == 1 and harness.sleeps == []


def test_connection_refused_is_a_retried_network_error() -> None:
    """Nobody listening is a network_error, retried within the quota."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    harness = Harness(None, base_url=f"http://127.0.0.1:{port}/v1")
    error = fails(harness)
    assert error.kind == "network_error" and error.retryable and len(harness.sleeps) == 2


def test_a_slow_server_is_a_timeout(server: ScriptedServer) -> None:
    """An answer slower than timeout_s is a timeout error (the Run manager maps it to TIMEOUT)."""
    server.queue(Reply(delay_s=1.0, body={}))
    error = fails(Harness(server, timeout_s=0.2, quota=RetryQuota(max_attempts=1)))
    assert error.kind == "timeout"


@pytest.mark.parametrize(("reply", "needle"), [
    (api.completion(None, tool_calls=[("c1", "orders__lookup", '{"order_id": "A-1"')]), "not JSON"),
    (api.completion(None, tool_calls=[("c1", "orders__lookup", '["A-1"]')]), "not a JSON object"),
    (api.completion(None, tool_calls=[("c1", "drop_tables", "{}")]), "drop_tables"),
    (Reply(200, raw=b"<html>gateway</html>"), "malformed"),
    (Reply(200, {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": []}),
     "no choices"),
])
def test_malformed_answers_are_clear_errors_not_crashes(server: ScriptedServer, reply: Reply,
                                                        needle: str) -> None:
    """Broken tool-call JSON, non-object arguments, invented tools and garbage bodies are non-retryable
    malformed_response errors naming the problem."""
    server.queue(reply)
    error = fails(Harness(server))
    assert error.kind == "malformed_response" and not error.retryable
    assert needle in str(error)


def test_malformed_streamed_arguments_are_refused(server: ScriptedServer) -> None:
    """Tool arguments that only break once the stream is reassembled are refused the same way."""
    server.queue(api.stream([], tool_calls=[("c1", "orders__lookup", '{"order_id": ')]))
    assert fails(Harness(server, stream=True)).kind == "malformed_response"


def test_plan_mode_tool_forces_submit_plan_and_reads_the_plan_from_it(server: ScriptedServer) -> None:
    """In plan_mode "tool" the submit_plan tool is forced and its arguments are the plan content."""
    plan = {"steps": [{"id": "a", "tool_call": {"skill": "orders.lookup", "arguments": {}},
                       "output_key": "a"}]}
    server.queue(api.completion(None, tool_calls=[("c1", "submit_plan", json.dumps(plan))]))
    request = ASK.model_copy(update={"purpose": "plan"})
    response = Harness(server, plan_mode="tool").provider.complete(request)
    assert json.loads(response.content) == plan and response.tool_calls == ()
    assert server.received[0].body["tool_choice"] == {"type": "function", "function": {"name": "submit_plan"}}


def test_plan_mode_json_keeps_tools_visible_but_not_callable(server: ScriptedServer) -> None:
    """When planning from JSON content, the skills are sent for their schemas with tool_choice none."""
    server.queue(api.completion('{"steps": []}'))
    Harness(server).provider.complete(ASK.model_copy(update={"purpose": "plan"}))
    assert server.received[0].body["tool_choice"] == "none"


def test_the_plan_is_asked_for_with_the_json_schema_of_a_plan_over_the_skills(server: ScriptedServer) -> None:
    """A planning request carries a response format whose schema admits only the offered skills, each with its
    own arguments (or a $ref); a tool request carries none."""
    server.queue(api.completion('{"steps": []}'), api.completion("ok"))
    Harness(server).provider.complete(ASK.model_copy(update={"purpose": "plan"}))
    Harness(server).provider.complete(ASK)
    plan_body, tool_body = (r.body for r in server.received)
    assert "response_format" not in tool_body
    fmt = plan_body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "plan"
    (call,) = fmt["json_schema"]["schema"]["properties"]["steps"]["items"]["properties"]["tool_call"]["anyOf"]
    assert call["properties"]["skill"] == {"const": "orders.lookup"}
    assert call["properties"]["arguments"]["properties"]["order_id"]["anyOf"][0] == {"type": "string"}


def test_a_local_server_gets_the_schema_its_way_and_the_tools_in_the_prompt(server: ScriptedServer) -> None:
    """For a llama.cpp-style server the schema rides in a json_object response format, the skills are described in
    the system prompt instead of sent as tools, and the answer's length is capped."""
    server.queue(api.completion('{"steps": []}'))
    Harness(server, plan_format="json_object", tools_in_prompt=True, max_output_tokens=300).provider.complete(
        ASK.model_copy(update={"purpose": "plan"}))
    body = server.received[0].body
    assert body["response_format"]["type"] == "json_object" and "schema" in body["response_format"]
    assert "tools" not in body and "tool_choice" not in body and body["max_tokens"] == 300
    assert "orders.lookup: Look up an order." in body["messages"][0]["content"]


def test_model_breaker_opens_falls_back_and_recovers(server: ScriptedServer) -> None:
    """Failing calls open the model's breaker; the fallback model then answers (and says so); after the
    reset timeout a trial goes to the primary again and its success closes the breaker."""
    harness = Harness(server, fallback_model="gpt-small", quota=RetryQuota(max_attempts=1),
                      breaker=BreakerConfig(failure_threshold=2, reset_timeout=60))
    server.queue(api.error(500, "down", kind="server_error"))
    assert fails(harness).kind == "server_error"  # one failure: still closed, the error goes to the caller
    server.queue(api.error(500, "down", kind="server_error"),
                 api.completion("from the fallback", model="gpt-small"))
    switched = harness.provider.complete(ASK)
    assert isinstance(switched, FallbackResponse) and switched.content == "from the fallback"
    assert switched.fallback_from == "gpt-test" and "server_error" in switched.fallback_reason
    server.queue(api.completion("still fallback", model="gpt-small"))
    assert harness.provider.complete(ASK).content == "still fallback"  # open: primary not even tried
    assert [r.body["model"] for r in server.received] == ["gpt-test", "gpt-test", "gpt-small", "gpt-small"]
    breaker = harness.provider.breakers.get("llm:openai:gpt-test")
    assert breaker.state is BreakerState.OPEN
    harness.clock.advance(60)
    server.queue(api.completion("primary is back"))
    recovered = harness.provider.complete(ASK)
    assert recovered.content == "primary is back" and not isinstance(recovered, FallbackResponse)
    assert breaker.state.value == "closed" and server.received[-1].body["model"] == "gpt-test"


def test_client_errors_do_not_open_the_breaker(server: ScriptedServer) -> None:
    """Bad requests say nothing about the model's health: they never trip its breaker."""
    harness = Harness(server, fallback_model="gpt-small", breaker=BreakerConfig(failure_threshold=1))
    server.queue(api.error(400, "bad request"), api.error(400, "bad request"))
    assert fails(harness).kind == "client_error" and fails(harness).kind == "client_error"
    assert harness.provider.breakers.get("llm:openai:gpt-test").state is BreakerState.CLOSED


def test_open_breaker_without_fallback_is_a_typed_error(server: ScriptedServer) -> None:
    """With no fallback model an open breaker refuses at once with kind circuit_open, sending nothing."""
    harness = Harness(server, quota=RetryQuota(max_attempts=1), breaker=BreakerConfig(failure_threshold=1))
    server.queue(api.error(502, "bad gateway", kind="server_error"))
    assert fails(harness).kind == "circuit_open"
    assert fails(harness).kind == "circuit_open" and len(server.received) == 1


PLAN = {"steps": [{"id": "a", "tool_call": {"skill": "test.echo", "arguments": {"text": "hi"}},
                   "output_key": "a"}], "answer_template": "{a.text}"}
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


def test_a_run_planned_by_the_provider_records_its_cost(server: ScriptedServer, tmp_path: Path,
                                                        call_log: Path) -> None:
    """A Run planned through the real provider succeeds and leaves a CostTrace with the call's tokens
    and price — the record budgets are checked against."""
    server.queue(api.completion(json.dumps(PLAN), usage=(1200, 300)))
    settings = Settings(db=str(tmp_path / "rt.db"), skills_dirs=(FIXTURES / "skills",),
                        policy_file=FIXTURES / "policy.yaml", identities_file=FIXTURES / "identities.yaml",
                        data_dir=tmp_path / "data")
    rt = build_runtime(settings, provider=Harness(server).provider)
    try:
        result = rt.runs.create_run({"task": "echo hi", **TESS})
        assert result.state == "SUCCEEDED" and result.answer == "hi"
        rt.store.drain_all()
        costs = [r.data() for r in rt.store.trace_of(result.run_id) if r.kind == "cost"]
        assert len(costs) == 1
        assert costs[0]["source"] == "llm:openai:plan"
        assert (costs[0]["input_tokens"], costs[0]["output_tokens"]) == (1200, 300)
        assert costs[0]["usd"] == pytest.approx((1200 * 2.0 + 300 * 8.0) / 1e6)
        assert rt.runs.ledger.spent(tenant_id="t1", run_id=result.run_id) == pytest.approx(costs[0]["usd"])
        assert server.received[0].body["tool_choice"] == "none"
    finally:
        rt.close()


def test_pricing_by_prefix_and_default() -> None:
    """A dated snapshot takes its family's price; an unlisted model takes the default or costs 0."""
    table = PricingTable(models={"gpt-4o": ModelPrice(input_per_mtok=1, output_per_mtok=1),
                                 "gpt-4o-mini": ModelPrice(input_per_mtok=0.1, output_per_mtok=0.1)})
    assert table.cost("gpt-4o-mini-2024-07-18", 1_000_000, 0) == pytest.approx(0.1)
    assert table.cost("gpt-4o-2024-08-06", 1_000_000, 0) == pytest.approx(1.0)
    assert table.cost("llama3", 1_000_000, 1_000_000) == 0.0
    with_default = table.model_copy(update={"default": ModelPrice(input_per_mtok=3, output_per_mtok=0)})
    assert with_default.cost("llama3", 1_000_000, 0) == pytest.approx(3.0)


def test_a_fallback_switch_is_traced_with_the_run_and_replays(server: ScriptedServer, tmp_path: Path,
                                                              call_log: Path) -> None:
    """When the breaker sends a Run's planning call to the fallback model, the Run's "llm" trace record
    names the switch, and the Run replays from its recording without touching the server."""
    harness = Harness(server, fallback_model="gpt-small", quota=RetryQuota(max_attempts=1),
                      breaker=BreakerConfig(failure_threshold=1))
    server.queue(api.error(503, "unavailable", kind="server_error"),
                 api.completion(json.dumps(PLAN), model="gpt-small"))
    settings = Settings(db=str(tmp_path / "rt.db"), skills_dirs=(FIXTURES / "skills",),
                        policy_file=FIXTURES / "policy.yaml", identities_file=FIXTURES / "identities.yaml",
                        data_dir=tmp_path / "data")
    rt = build_runtime(settings, provider=harness.provider)
    try:
        result = rt.runs.create_run({"task": "echo hi", **TESS})
        assert result.state == "SUCCEEDED"
        rt.store.drain_all()
        llm = [r.data() for r in rt.store.trace_of(result.run_id) if r.kind == "llm"]
        assert len(llm) == 1 and llm[0]["fallback_from"] == "gpt-test" and llm[0]["model"] == "gpt-small"
        assert "server_error" in llm[0]["fallback_reason"]
        requests = len(server.received)
        report = replay(result.run_id, rt.store, settings)
        assert report.ok, report.divergences
        assert len(server.received) == requests
    finally:
        rt.close()


def test_settings_select_the_openai_provider(server: ScriptedServer, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """HARNESS_LLM=openai with a model, base URL, key variable and pricing file builds the real
    provider; without the key the runtime refuses to start with a clear message."""
    pricing = tmp_path / "pricing.yaml"
    pricing.write_text("models:\n  gpt-test: {input_per_mtok: 2.0, output_per_mtok: 8.0}\n")
    for key, value in (("HARNESS_LLM", "openai"), ("HARNESS_LLM_MODEL", "gpt-test"),
                       ("HARNESS_LLM_BASE_URL", f"{server.origin}/v1"),
                       ("HARNESS_LLM_API_KEY_ENV", "TEST_KEY"),
                       ("HARNESS_LLM_PRICING", str(pricing)), ("HARNESS_LLM_STREAM", "true"),
                       ("HARNESS_LLM_TOP_P", "0.9")):
        monkeypatch.setenv(key, value)
    settings = Settings.from_env(db=str(tmp_path / "rt.db"), data_dir=tmp_path / "data")
    with pytest.raises(InvalidRequestError, match=r"\$TEST_KEY"):
        build_runtime(settings)
    monkeypatch.setenv("TEST_KEY", "sk-from-env")
    rt = build_runtime(settings)
    try:
        provider = rt.runs.orchestrator.provider
        assert isinstance(provider, OpenAICompatProvider) and isinstance(provider, GuardedProvider)
        assert rt.runs.orchestrator.max_attempts == 1  # the provider retries; the orchestrator must not
        server.queue(api.stream(["hi"], usage=(1_000_000, 0)))
        assert provider.complete(ASK).usage.cost_usd == pytest.approx(2.0)
        assert server.received[0].headers["authorization"] == "Bearer sk-from-env"
        assert server.received[0].body["top_p"] == 0.9  # HARNESS_LLM_TOP_P reaches the wire
    finally:
        rt.close()


# ------------------------------------------------------------------------------------------------ log lines

def llm_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "harness.llm"]


def test_each_failed_call_is_one_warning_line_saying_what_happens_next(server: ScriptedServer,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A retried failure says which attempt failed, how, and when it is tried again; a call that fails for
    good says after how many attempts; a call that succeeds logs nothing."""
    caplog.set_level(logging.DEBUG, logger="harness.llm")
    server.queue(api.error(429, "Rate limit reached", headers={"retry-after": "1.5"}), api.completion("ok"))
    assert Harness(server).provider.complete(ASK).content == "ok"
    (retried,) = llm_lines(caplog)
    assert retried.levelno == logging.WARNING
    assert (retried.error_kind, retried.attempt, retried.retry_in_s, retried.model) == (  # type: ignore[attr-defined]
        "rate_limit", 1, 1.5, "gpt-test")
    assert "attempt 1, retried in 1.50 s" in retried.getMessage() and "Rate limit reached" in retried.getMessage()

    caplog.clear()
    server.queue(*[api.error(503, "down", kind="server_error")] * 3)
    fails(Harness(server))
    lines = llm_lines(caplog)
    assert [getattr(r, "attempt", None) for r in lines] == [1, 2, None]
    assert lines[-1].attempts == 3 and "failed (server_error) after 3 attempts" in lines[-1].getMessage()  # type: ignore[attr-defined]

    caplog.clear()
    server.queue(api.error(401, "Incorrect API key provided", code="invalid_api_key"))
    fails(Harness(server))
    (final,) = llm_lines(caplog)
    assert "failed (auth) after 1 attempt:" in final.getMessage() and final.levelno == logging.WARNING
    assert "sk-test" not in final.getMessage()  # the key is never in a log line


def test_a_failure_that_opens_the_circuit_says_so_and_names_the_fallback(server: ScriptedServer,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The failure that opens a model's circuit says for how long and which model answers meanwhile; the
    calls the open circuit then sends to the fallback add no warning each."""
    caplog.set_level(logging.INFO, logger="harness.llm")
    harness = Harness(server, fallback_model="gpt-small", quota=RetryQuota(max_attempts=1),
                      breaker=BreakerConfig(failure_threshold=1, reset_timeout=60))
    server.queue(api.error(500, "down", kind="server_error"), api.completion("fallback", model="gpt-small"),
                 api.completion("fallback again", model="gpt-small"))
    assert isinstance(harness.provider.complete(ASK), FallbackResponse)
    assert isinstance(harness.provider.complete(ASK), FallbackResponse)
    (opened,) = llm_lines(caplog)
    assert opened.circuit_opened is True  # type: ignore[attr-defined]
    assert "the circuit for gpt-test is open for 60 s, the fallback model gpt-small answers meanwhile" in \
        opened.getMessage()


def test_a_long_error_answer_is_cut_in_the_log_line(server: ScriptedServer, caplog: pytest.LogCaptureFixture) -> None:
    """A provider answering with a page of text does not put the page in the log: one bounded line."""
    caplog.set_level(logging.INFO, logger="harness.llm")
    server.queue(api.error(400, "bad\nrequest " + "x" * 5_000))
    fails(Harness(server))
    (line,) = llm_lines(caplog)
    message = line.getMessage()
    assert "\n" not in message and len(message) < 500 and message.endswith("…")


def test_a_providers_control_characters_never_reach_the_log(server: ScriptedServer,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """An error answer carrying terminal escapes or other control characters is logged without them: the
    provider's text is not ours to write to an operator's terminal."""
    caplog.set_level(logging.INFO, logger="harness.llm")
    server.queue(api.error(400, "bad \x1b[2J\x1b[31mrequest\x07\x00 here"))
    fails(Harness(server))
    (line,) = llm_lines(caplog)
    message = line.getMessage()
    assert message.isprintable() and "bad" in message and "request" in message and "here" in message


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """The process's logging as it was, after a test that configures it as the service does."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    clients = {name: logging.getLogger(name).level for name in ROUTINE_AT_INFO}
    try:
        yield
    finally:
        root.handlers[:], root.level = handlers, level
        for name, was in clients.items():
            logging.getLogger(name).setLevel(was)


def test_the_service_logs_a_failed_call_with_its_run_and_no_line_per_request(
        server: ScriptedServer, capsys: pytest.CaptureFixture[str], restored_logging: None) -> None:
    """Configured as `harness serve` configures it (JSON lines at INFO), the log holds no line for each HTTP
    request the SDK sends, and the one failed attempt as a line of harness.llm carrying the Run's id. At
    DEBUG the HTTP client's own lines come back."""
    from harness.service import logs

    logs.configure(json_lines=True, level="INFO")
    server.queue(api.error(502, "bad gateway", kind="server_error"), api.completion("ok"))
    with logs.run_context("run-42"):
        assert Harness(server).provider.complete(ASK).content == "ok"
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert [line["logger"] for line in lines] == ["harness.llm"]
    assert (lines[0]["run_id"], lines[0]["error_kind"], lines[0]["level"]) == ("run-42", "server_error", "warning")

    logs.configure(json_lines=True, level="DEBUG")
    server.queue(api.completion("ok"))
    Harness(server).provider.complete(ASK)
    err = capsys.readouterr().err
    assert any(json.loads(line)["logger"] in HTTP_CLIENT_LOGGERS for line in err.splitlines() if line.startswith("{"))


def test_a_celery_worker_keeps_the_http_client_at_debug_too(restored_logging: None) -> None:
    """The worker's logging, set up by Celery, gets the same rule when Celery has configured it."""
    from harness.celery_app import _routine_at_debug

    _routine_at_debug(loglevel=logging.INFO)
    assert {logging.getLogger(name).level for name in ROUTINE_AT_INFO} == {logging.WARNING}
    _routine_at_debug(loglevel=logging.DEBUG)
    assert {logging.getLogger(name).level for name in ROUTINE_AT_INFO} == {logging.NOTSET}
