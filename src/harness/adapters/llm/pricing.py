"""What a model call costs: a per-model price table from configuration (SPEC G1 budgets, A1 CostTrace).

A pricing file is YAML, prices in USD per million tokens::

    models:
      gpt-4o-mini: {input_per_mtok: 0.15, output_per_mtok: 0.60}
      claude-sonnet-4: {input_per_mtok: 3.0, output_per_mtok: 15.0}
    default: {input_per_mtok: 0, output_per_mtok: 0}     # optional: for models not listed

A model is priced by its exact name, else by the longest listed name it starts with (so a dated
snapshot such as ``gpt-4o-mini-2024-07-18`` takes the ``gpt-4o-mini`` price). A model with no price
and no default costs 0 and is logged once: budgets cannot see what is not priced, so say it loudly.
No prices ship with harness: they change, and only the operator knows the contract.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from harness.yamlfile import load_yaml_model

log = logging.getLogger(__name__)


class ModelPrice(BaseModel):
    """USD per million input and output tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)


class PricingTable(BaseModel):
    """Prices by model name."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    models: dict[str, ModelPrice] = Field(default_factory=dict)
    default: ModelPrice | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> PricingTable:
        """Load a pricing file; a broken one is a BadInputError naming the file and the field."""
        return load_yaml_model(path, cls, "the pricing file")

    def price_of(self, model: str) -> ModelPrice | None:
        """The price that applies to `model`, or None when neither it nor a default is listed."""
        if model in self.models:
            return self.models[model]
        prefixes = [name for name in self.models if model.startswith(name)]
        if prefixes:
            return self.models[max(prefixes, key=len)]
        return self.default

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float:
        """USD for one call, rounded to 1e-8."""
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
        log.warning("no price configured for model %r: its calls are recorded at 0 USD and budgets "
                    "cannot count them", model)
