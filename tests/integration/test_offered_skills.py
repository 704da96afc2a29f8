"""The skills offered to the model are those the caller may use (SPEC T2): the skill list a Run's model
call carries is filtered by the caller's permissions before the model sees it, so a skill the caller may
not call is never put in front of the model (nor named anywhere in its request). Recorded at the provider
boundary, on the real pipeline with the scripted model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from harness.adapters.llm.scripted import ScriptedProvider
from harness.config import Runtime, build_runtime
from harness.domain.llm import LLMRequest, LLMResponse
from harness.settings import Settings
from tests.conftest import FIXTURES


class Recording(ScriptedProvider):
    """The scripted model, keeping every request it is sent."""

    requests: list[LLMRequest]

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        return super().complete(request)


@pytest.fixture
def recorded(tmp_path: Path, call_log: Path) -> Iterator[tuple[Runtime, Recording]]:
    """The test skills, rules, policy and identities (test.deploy is forbidden unless the caller is a
    deployer), on the recording scripted model."""
    provider = cast(Recording, Recording.from_file(FIXTURES / "llm_rules.yaml"))
    provider.requests = []
    rt = build_runtime(Settings(db=str(tmp_path / "h.db"), skills_dirs=(FIXTURES / "skills",),
                                policy_file=FIXTURES / "policy.yaml", llm_rules=FIXTURES / "llm_rules.yaml",
                                identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data",
                                memory="off"), provider=provider)
    yield rt, provider
    rt.close()


def offered(request: LLMRequest) -> set[str]:
    return {tool.name for tool in request.tools}


def test_a_skill_the_caller_may_not_use_is_not_offered_to_the_model(recorded: tuple[Runtime, Recording]) -> None:
    """A tester's Run offers the model the test skills but not test.deploy, which only a deployer may call:
    not as a tool and not by name anywhere in the request. A deployer's Run of the same task is offered
    it, so the difference is the caller's permissions, not the registry."""
    rt, provider = recorded
    done = rt.runs.create_run({"task": "echo hi", "tenant_id": "t1", "user_id": "tess", "roles": ["tester"]})
    assert done.state == "SUCCEEDED", done.error
    (plan_call,) = provider.requests
    assert "test.echo" in offered(plan_call) and "test.update" in offered(plan_call)
    assert "test.deploy" not in offered(plan_call)
    assert "test.deploy" not in plan_call.model_dump_json()
    provider.requests.clear()
    done = rt.runs.create_run({"task": "echo hi", "tenant_id": "t1", "user_id": "dana",
                               "roles": ["tester", "deployer"]})
    assert done.state == "SUCCEEDED", done.error
    (plan_call,) = provider.requests
    assert {"test.echo", "test.deploy"} <= offered(plan_call)
