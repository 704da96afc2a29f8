"""The price table (SPEC G1): harness ships dated prices for current OpenAI and Anthropic models, a
deployment's file overrides them, and an unpriced model is the policy's choice, never a silent zero."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

from harness.adapters.llm.pricing import PricingTable
from harness.config import build_runtime
from harness.domain.errors import InvalidRequestError
from harness.settings import Settings
from harness.wiring.llm import check_priced

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_the_shipped_table_is_dated_and_prices_current_models() -> None:
    """The shipped table says when its prices were taken and prices OpenAI and Anthropic models,
    dated snapshots included."""
    table = PricingTable.shipped()
    assert table.as_of and dt.date.fromisoformat(table.as_of) <= dt.date.today()
    for model in ("gpt-4o-mini", "gpt-4.1", "gpt-5", "o4-mini", "claude-sonnet-4-5", "claude-haiku-4-5",
                  "claude-opus-4-1", "gpt-4o-mini-2024-07-18", "claude-sonnet-4-20250514"):
        price = table.price_of(model)
        assert price is not None and price.input_per_mtok > 0 and price.output_per_mtok > price.input_per_mtok, model
    assert table.cost("gpt-4o-mini", 1_000_000, 1_000_000) == pytest.approx(0.75)
    assert table.price_of("my-local-model") is None and table.sandbox_price > 0


def test_a_deployment_file_overrides_and_extends_the_shipped_table(tmp_path: Path) -> None:
    """The deployment's prices win for the models it lists, add the ones it adds, and keep the rest."""
    path = tmp_path / "prices.yaml"
    path.write_text(yaml.safe_dump({"as_of": "2026-12-01", "sandbox_per_s": 0.001, "models": {
        "gpt-4o-mini": {"input_per_mtok": 0.1, "output_per_mtok": 0.2},
        "my-local-model": {"input_per_mtok": 0.0, "output_per_mtok": 0.0}}}))
    table = PricingTable.for_deployment(path)
    assert table.price_of("gpt-4o-mini").input_per_mtok == 0.1  # type: ignore[union-attr]
    assert table.price_of("my-local-model") is not None and table.price_of("gpt-4.1") is not None
    assert (table.as_of, table.sandbox_price) == ("2026-12-01", 0.001)


def test_a_broken_pricing_file_is_an_error_naming_the_field(tmp_path: Path) -> None:
    """A negative price is refused with the file and the field named."""
    path = tmp_path / "prices.yaml"
    path.write_text(yaml.safe_dump({"models": {"x": {"input_per_mtok": -1, "output_per_mtok": 1}}}))
    with pytest.raises(Exception, match=r"prices.yaml: models.x.input_per_mtok"):
        PricingTable.for_deployment(path)


def test_an_unpriced_model_is_refused_at_start_when_the_policy_denies_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With `unpriced_model: deny` (the default) a real provider whose model has no price does not
    start; with `allow_with_warning` it does."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    settings = Settings(db=str(tmp_path / "x.db"), llm="openai", llm_model="my-local-model",
                        llm_base_url="http://127.0.0.1:9/v1")
    table = PricingTable.shipped()
    with pytest.raises(InvalidRequestError, match="'my-local-model' has no price"):
        check_priced(settings, table, "deny")
    check_priced(settings, table, "allow_with_warning")
    check_priced(settings.model_copy(update={"llm_model": "gpt-4o-mini"}), table, "deny")
    policy = yaml.safe_load((FIXTURES / "policy.yaml").read_text())
    policy["permissions"]["cedar"] = str(FIXTURES / "policies.cedar")
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    with pytest.raises(InvalidRequestError, match="allow_with_warning"):
        build_runtime(settings.model_copy(update={"policy_file": tmp_path / "policy.yaml"}))


def test_unpriced_calls_are_rejected_or_warned_by_the_budget_rule(tmp_path: Path, call_log: Path) -> None:
    """A Run whose calls were recorded without a price is rejected at policy under deny, and passes with
    a warning verdict naming the model under allow_with_warning."""
    from harness.adapters.llm.scripted import ScriptedProvider
    from harness.domain.llm import LLMRequest, LLMResponse, Usage

    class Unpriced:
        """The scripted provider, as if its model had no price."""

        name = "scripted"

        def __init__(self) -> None:
            self.inner = ScriptedProvider.from_file(FIXTURES / "llm_rules.yaml")

        def complete(self, request: LLMRequest) -> LLMResponse:
            answer = self.inner.complete(request)
            usage = Usage(input_tokens=answer.usage.input_tokens, output_tokens=answer.usage.output_tokens,
                          priced=False)
            return answer.model_copy(update={"usage": usage, "model": "mystery-model"})

    for choice, state in (("deny", "CLOSED_REJECTED"), ("allow_with_warning", "SUCCEEDED")):
        folder = tmp_path / choice
        folder.mkdir()
        policy = yaml.safe_load((FIXTURES / "policy.yaml").read_text())
        policy["permissions"]["cedar"] = str(FIXTURES / "policies.cedar")
        policy["budgets"]["unpriced_model"] = choice
        (folder / "policy.yaml").write_text(yaml.safe_dump(policy))
        rt = build_runtime(Settings(db=str(folder / "x.db"), skills_dirs=(FIXTURES / "skills",),
                                    policy_file=folder / "policy.yaml", identities_file=FIXTURES / "identities.yaml",
                                    data_dir=folder / "data"), provider=Unpriced())
        try:
            result = rt.runs.create_run({"task": "echo hi", "tenant_id": "t1", "user_id": "tess",
                                         "roles": ["tester"]})
            assert result.state == state, result.error
            rt.store.drain_all()
            verdicts = [v for r in rt.store.trace_of(result.run_id) if r.kind == "policy"
                        for v in r.data()["verdicts"] if v["rule_id"] == "budget.unpriced_model"]
            assert len(verdicts) == 1 and "mystery-model" in verdicts[0]["reason"]
            assert rt.runs.ledger.run_total(result.run_id).unpriced == 1
        finally:
            rt.close()
