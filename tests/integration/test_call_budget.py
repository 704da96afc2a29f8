"""A budget cap holds before a model call: the call's worst case (its prompt and max_tokens of output at
the model's price) must fit what the tightest cap has left. A call that would not fit is asked for fewer
output tokens; one that cannot fit even a short answer is not made, and the Run fails naming the cap."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import yaml

from harness.adapters.llm.scripted import ScriptedProvider
from harness.config import Runtime, build_runtime
from harness.domain.llm import LLMRequest, LLMResponse
from harness.settings import Settings
from tests.conftest import FIXTURES

TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


class Counting(ScriptedProvider):
    """The scripted model, priced by the test rules, recording the max_tokens of every call it gets."""

    asked: list[int]

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.asked.append(request.max_tokens)
        return super().complete(request)


def runtime(backend_url: str, tmp_path: Path, per_run_usd: float) -> tuple[Runtime, Counting]:
    """A runtime whose only budget cap is `per_run_usd`, on the counting scripted model."""
    policy = yaml.safe_load((FIXTURES / "policy.yaml").read_text())
    policy["budgets"] = {"per_run_usd": per_run_usd}
    policy["permissions"]["cedar"] = str(FIXTURES / "policies.cedar")
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    provider = cast(Counting, Counting.from_file(FIXTURES / "llm_rules.yaml"))  # 0.01 USD / 1k in, 0.03 USD / 1k out
    provider.asked = []
    # the fixtures' rules priced, the test's policy: the test skills, their Cedar file, one per-Run cap
    rt = build_runtime(Settings(db=backend_url, skills_dirs=(FIXTURES / "skills",),
                                policy_file=tmp_path / "policy.yaml",
                                llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                                data_dir=tmp_path / "data"), provider=provider)
    return rt, provider


@pytest.mark.parametrize(("cap", "outcome"), [(1.0, "full"), (0.05, "fewer"), (0.004, "refused")])
def test_a_model_call_is_held_to_the_budget_before_it_is_made(backend_url: str, tmp_path: Path, call_log: Path,
                                                              cap: float, outcome: str) -> None:
    """With room for the worst case the plan call asks its full max_tokens; with less, fewer tokens that
    fit; with no room for even a short answer, no call is made and the Run fails on the per-Run cap."""
    rt, provider = runtime(backend_url, tmp_path, cap)
    try:
        done = rt.runs.create_run({"task": "echo hi", **TESS})
        if outcome == "refused":
            assert provider.asked == []
            assert done.state == "CLOSED_FAILED" and (done.error or "").startswith("budget_exceeded: budget.per_run")
            assert "the call was not made" in (done.error or "")
            return
        assert done.state == "SUCCEEDED", done.error
        assert len(provider.asked) == 1
        if outcome == "full":
            assert provider.asked == [4_096]
        else:  # what is left of 0.05 USD after the prompt, at 0.03 USD per 1k output tokens
            assert 256 <= provider.asked[0] < 4_096 and provider.asked[0] * 0.03 / 1000 < cap
    finally:
        rt.close()
