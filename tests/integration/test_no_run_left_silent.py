"""No Run is left silent: an exception no step expected ends the Run FAILED at once with an ErrorTrace
naming it (type and stack hash), not in PLANNING for the sweeper; errors that are not the Run's failure
still propagate; a failed tool call writes its key event; every planning attempt is recorded and a
planning timeout is named as one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.adapters.llm.scripted import ScriptedProvider
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.errors import ProviderError, SkillsElsewhereError, StoreError
from harness.domain.llm import LLMRequest, LLMResponse
from harness.settings import Settings
from tests.conftest import FIXTURES

TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


class Flaky:
    """The scripted provider, with its plan calls answered by `plan` first (raise, or None to pass on)."""

    def __init__(self, plan: Callable[[int], None]) -> None:
        self.inner = ScriptedProvider.from_file(FIXTURES / "llm_rules.yaml")
        self.name = self.inner.name
        self.plan = plan
        self.plans = 0

    def complete(self, request: LLMRequest) -> LLMResponse:
        if request.purpose == "plan":
            self.plans += 1
            self.plan(self.plans)
        return self.inner.complete(request)


@pytest.fixture
def make(backend_url: str, tmp_path: Path, call_log: Path) -> Iterator[Callable[[Flaky | None], Runtime]]:
    """Builds a runtime over the test skills on the backend under test, with a given provider."""
    made: list[Runtime] = []

    def build(provider: Flaky | None = None) -> Runtime:
        settings = Settings(db=backend_url, skills_dirs=(FIXTURES / "skills",), policy_file=FIXTURES / "policy.yaml",
                            llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                            data_dir=tmp_path / "data")
        made.append(build_runtime(settings, clock=FakeClock(), provider=provider))
        return made[-1]

    yield build
    for rt in made:
        rt.close()


def errors_of(rt: Runtime, run_id: str) -> list[dict[str, object]]:
    rt.store.drain_all()
    return [r.data() for r in rt.store.trace_of(run_id) if r.kind == "error"]


def llm_records(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    rt.store.drain_all()
    return [r.data() for r in rt.store.trace_of(run_id) if r.kind == "llm"]


def _key_error(_: int) -> None:
    raise KeyError("choices")


def test_a_providers_key_error_fails_the_run_at_once_named_with_its_stack_hash(
        make: Callable[[Flaky | None], Runtime]) -> None:
    """A KeyError raised by the provider while planning closes the Run CLOSED_FAILED in the same drive
    (not PLANNING until the sweeper): its ErrorTrace names KeyError and carries a stack hash."""
    rt = make(Flaky(_key_error))
    done = rt.runs.create_run({"task": "echo hi", **TESS})
    assert done.state == "CLOSED_FAILED", done
    assert list(done.path)[-4:] == ["PLANNING", "FAILED", "TRACING", "CLOSED_FAILED"]
    assert "KeyError" in (done.error or "")
    [error] = errors_of(rt, done.run_id)
    assert error["error_code"] == "unexpected_KeyError" and error["step"] == 4
    assert isinstance(error["stack_hash"], str) and len(error["stack_hash"]) == 64
    assert [e.event for e in rt.store.audit_events(run_id=done.run_id, event="run_failed")] == ["run_failed"]


def test_an_unexpected_error_in_the_policy_check_fails_the_run_too(
        make: Callable[[Flaky | None], Runtime], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same in another step: a bug in the policy check ends the Run FAILED from POLICY_CHECK."""
    rt = make(None)

    def broken(*args: object, **kwargs: object) -> None:
        raise AttributeError("'NoneType' object has no attribute 'level'")

    monkeypatch.setattr(rt.runs.policy, "evaluate", broken)
    done = rt.runs.create_run({"task": "echo hi", **TESS})
    assert done.state == "CLOSED_FAILED" and "POLICY_CHECK" in done.path and "AttributeError" in (done.error or "")
    assert [e["error_code"] for e in errors_of(rt, done.run_id)] == ["unexpected_AttributeError"]


@pytest.mark.parametrize("error", [StoreError("the database went away"), SkillsElsewhereError("r", ["x.y"])])
def test_store_and_lease_errors_and_skills_elsewhere_still_propagate(
        make: Callable[[Flaky | None], Runtime], monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """Errors that are not the Run's failure reach the caller as before (the drive's unit rolled back),
    and no Run is failed for them."""
    rt = make(None)

    def raising(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(rt.runs.policy, "evaluate", raising)
    with pytest.raises(type(error)):
        rt.runs.create_run({"task": "echo hi", **TESS})
    assert rt.store.audit_events(event="run_failed") == []


def test_a_failed_tool_call_writes_tool_call_failed(make: Callable[[Flaky | None], Runtime]) -> None:
    """A skill that fails leaves the key event tool_call_failed (its step, skill and code) besides run_failed."""
    rt = make(None)
    done = rt.runs.create_run({"task": "fail", **TESS})
    assert done.state == "CLOSED_FAILED"
    [event] = rt.store.audit_events(run_id=done.run_id, event="tool_call_failed")
    assert event.detail["step_id"] == "b" and event.detail["skill"] == "test.fail"
    assert event.detail["error_code"] == "RuntimeError"
    assert rt.store.audit_events(run_id=done.run_id, event="run_failed")


def test_every_planning_attempt_is_recorded_and_retries_are_counted(make: Callable[[Flaky | None], Runtime]) -> None:
    """Three provider attempts that all fail (retryable) leave three "llm" records, numbered, and an
    ErrorTrace with retries 2; two failures then an answer leave two error records and the plan."""

    def always(_: int) -> None:
        raise ProviderError("HTTP 503", kind="server_error", retryable=True)

    rt = make(Flaky(always))
    done = rt.runs.create_run({"task": "echo hi", **TESS})
    assert done.state == "CLOSED_FAILED"
    records = llm_records(rt, done.run_id)
    assert [r["error"]["attempt"] for r in records] == [1, 2, 3]
    [error] = errors_of(rt, done.run_id)
    assert error["retries"] == 2 and error["error_code"] == "llm_server_error"

    def twice(n: int) -> None:
        if n <= 2:
            raise ProviderError("HTTP 429", kind="rate_limit", retryable=True)

    rt = make(Flaky(twice))
    done = rt.runs.create_run({"task": "echo hi", **TESS})
    assert done.state == "SUCCEEDED", done.error
    plans = [r for r in llm_records(rt, done.run_id) if r["purpose"] == "plan"]
    assert [r.get("error", {}).get("attempt") for r in plans] == [1, 2, None]


def test_a_planning_timeout_is_named_planning_timeout(make: Callable[[Flaky | None], Runtime]) -> None:
    """A provider that times out while planning moves the Run to TIMEOUT with the key event
    planning_timeout, not execution_timeout."""

    def slow(_: int) -> None:
        raise ProviderError("the model did not answer in time", kind="timeout", retryable=False)

    rt = make(Flaky(slow))
    done = rt.runs.create_run({"task": "echo hi", **TESS})
    assert "TIMEOUT" in done.path
    events = [e.event for e in rt.store.audit_events(run_id=done.run_id)]
    assert "planning_timeout" in events and "execution_timeout" not in events
