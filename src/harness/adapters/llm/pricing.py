"""What a model call and a sandboxed second cost: a dated price table (SPEC G1 budgets, A1 CostTrace).

harness ships a table (`prices.yaml` beside this module: the providers' list prices for current OpenAI
and Anthropic models, with the date they were taken); a deployment overrides or extends it with its own
file (HARNESS_LLM_PRICING), same format, whose entries win::

    as_of: "2026-01-15"                 # when these prices were taken
    sandbox_per_s: 0.00003              # USD per second of a sandboxed call
    models:
      gpt-4o-mini: {input_per_mtok: 0.15, output_per_mtok: 0.60}
      my-finetune: {input_per_mtok: 0.30, output_per_mtok: 1.20}
    default: {input_per_mtok: 1, output_per_mtok: 4}     # optional: for models not listed

A model is priced by its exact name, else by the longest listed name it starts with (so a dated
snapshot such as ``gpt-4o-mini-2024-07-18`` takes the ``gpt-4o-mini`` price). A model with no price and
no default is *unpriced*: whether a Run may use one is the policy's choice (`budgets.unpriced_model`:
``deny`` refuses at start, ``allow_with_warning`` records its calls at 0 USD, marked unpriced, and says so
in the policy trace), never a silent zero.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from harness.yamlfile import load_yaml_model

log = logging.getLogger(__name__)
SHIPPED = Path(__file__).resolve().parent / "prices.yaml"


class ModelPrice(BaseModel):
    """USD per million input and output tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)


class PricingTable(BaseModel):
    """Prices by model name, the sandbox's price per second, and the date they were taken."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    as_of: str | None = None
    sandbox_per_s: float | None = Field(default=None, ge=0)
    models: dict[str, ModelPrice] = Field(default_factory=dict)
    default: ModelPrice | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> PricingTable:
        """Load a pricing file; a broken one is a BadInputError naming the file and the field."""
        return load_yaml_model(path, cls, "the pricing file")

    @classmethod
    def shipped(cls) -> PricingTable:
        """The table harness ships."""
        return cls.from_file(SHIPPED)

    @classmethod
    def for_deployment(cls, override: str | Path | None) -> PricingTable:
        """The shipped table with a deployment's file laid over it (its models, default, sandbox price and
        date win where it sets them)."""
        table = cls.shipped()
        return table if override is None else table.overlaid(cls.from_file(override))

    def overlaid(self, other: PricingTable) -> PricingTable:
        """This table with `other`'s entries on top."""
        return PricingTable(
            as_of=other.as_of or (f"{self.as_of} + deployment prices" if self.as_of else None),
            sandbox_per_s=other.sandbox_per_s if other.sandbox_per_s is not None else self.sandbox_per_s,
            models={**self.models, **other.models}, default=other.default or self.default)

    @property
    def sandbox_price(self) -> float:
        """USD per second of a sandboxed call (0 when the table names none)."""
        return self.sandbox_per_s or 0.0

    def price_of(self, model: str) -> ModelPrice | None:
        """The price that applies to `model`, or None when neither it nor a default is listed."""
        if model in self.models:
            return self.models[model]
        prefixes = [name for name in self.models if model.startswith(name)]
        if prefixes:
            return self.models[max(prefixes, key=len)]
        return self.default

    def token_price(self, model: str, fallback: str | None = None) -> tuple[float, float] | None:
        """USD per token in and out at the dearer of `model` and its `fallback` (a call may be served by
        either); None when `model` has no price."""
        primary = self.price_of(model)
        if primary is None:
            return None
        prices = [primary, *([p] if fallback and (p := self.price_of(fallback)) is not None else [])]
        return max(p.input_per_mtok for p in prices) / 1e6, max(p.output_per_mtok for p in prices) / 1e6

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float:
        """USD for one call, rounded to 1e-8; 0 (logged once) for an unpriced model."""
        price = self.price_of(model)
        if price is None:
            _warn_unpriced(model)
            return 0.0
        usd = (input_tokens * price.input_per_mtok + output_tokens * price.output_per_mtok) / 1_000_000
        return round(usd, 8)


_warned: set[str] = set()


def _warn_unpriced(model: str) -> None:
    if model not in _warned:
        _warned.add(model)
        log.warning("no price for model %r: its calls are recorded at 0 USD, marked unpriced (the policy "
                    "allows unpriced models with a warning)", model)
