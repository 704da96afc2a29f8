"""The model the settings name (HARNESS_LLM and its companions), and the checks made of its prices before
any call: a model call's worst case against the budget caps, and a model with no price refused when the
policy says so."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from harness.adapters.llm.factory import make_provider
from harness.adapters.llm.pricing import PricingTable
from harness.adapters.llm.resilient import GuardedProvider, ProviderSettings
from harness.adapters.llm.scripted import ScriptedProvider
from harness.domain.errors import InvalidRequestError
from harness.pipeline.call_budget import CallBudget, TokenPrice

if TYPE_CHECKING:
    from harness.domain.llm import LLMRequest
    from harness.pipeline.context_assembler import ContextAssembler
    from harness.pipeline.gatekeeper import PolicyEngine
    from harness.ports import Clock, LLMProvider
    from harness.settings import Settings

#: the model name and endpoint of HARNESS_LLM=local when HARNESS_LLM_MODEL / HARNESS_LLM_BASE_URL say nothing
LOCAL_MODEL = "smollm2-135m-instruct"
LOCAL_URL = "http://127.0.0.1:8080/v1"


def llm_provider(settings: Settings, clock: Clock) -> LLMProvider:
    """The LLM provider the settings name; a real one retries itself (T3), with the SDK's retries off."""
    if settings.llm == "scripted":
        return ScriptedProvider.from_file(settings.llm_rules)
    local = settings.llm == "local"
    key_env = settings.llm_api_key_env or f"{settings.llm.upper()}_API_KEY"
    api_key = "local" if local else os.environ.get(key_env)  # a server on this machine needs no key
    model = settings.llm_model or (LOCAL_MODEL if local else None)
    if not model or not api_key:
        raise InvalidRequestError(f"HARNESS_LLM={settings.llm} needs HARNESS_LLM_MODEL and an API key "
                                  f"in ${key_env}")
    return make_provider("openai" if local else settings.llm, ProviderSettings(
        model=model, api_key=api_key, base_url=settings.llm_base_url or (LOCAL_URL if local else None),
        fallback_model=settings.llm_fallback_model, timeout_s=settings.llm_timeout_s,
        stream=settings.llm_stream, plan_mode=settings.llm_plan_mode,
        pricing=PricingTable.for_deployment(settings.llm_pricing),
        plan_format=settings.llm_plan_format or ("json_object" if local else "json_schema"),
        tools_in_prompt=local if settings.llm_tools_in_prompt is None else settings.llm_tools_in_prompt,
        max_output_tokens=settings.llm_max_tokens or (512 if local else None),
        plan_max_steps=settings.llm_plan_max_steps or (1 if local else 8), top_p=settings.llm_top_p), clock=clock)


def call_budget(settings: Settings, provider: LLMProvider, policy: PolicyEngine,
                assembler: ContextAssembler) -> CallBudget:
    """The check of a model call's worst case against the budget caps, made before the call, at the price
    the provider says (the scripted rules' or the price table's), or, for a provider that says none (a
    replay's), at the price the settings give the deployment's model."""
    if isinstance(provider, ScriptedProvider | GuardedProvider):
        priced = provider.token_price
    elif settings.llm == "scripted":
        priced = ScriptedProvider.from_file(settings.llm_rules).token_price
    else:
        table = PricingTable.for_deployment(settings.llm_pricing)
        model = settings.llm_model or (LOCAL_MODEL if settings.llm == "local" else "")

        def priced(request: LLMRequest) -> tuple[float, float] | None:
            return table.token_price(request.model or model, settings.llm_fallback_model)

    def price(request: LLMRequest) -> TokenPrice | None:
        rates = priced(request)
        return TokenPrice(*rates) if rates is not None else None

    return CallBudget(policy.budget_room, price, assembler.tokenizer.count)


def check_priced(settings: Settings, pricing: PricingTable, unpriced: str) -> None:
    """Refuse, when the policy denies unpriced models, a real provider whose model or fallback model has no
    price: every call would count 0 USD and no budget would ever bite."""
    if settings.llm == "scripted" or unpriced != "deny":
        return
    named = settings.llm_model or (LOCAL_MODEL if settings.llm == "local" else None)
    for model in (named, settings.llm_fallback_model):
        if model and pricing.price_of(model) is None:
            raise InvalidRequestError(
                f"the model {model!r} has no price in the price table (dated {pricing.as_of}); add it to the "
                "file HARNESS_LLM_PRICING names, or set budgets.unpriced_model: allow_with_warning in the policy")
