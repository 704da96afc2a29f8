"""The retention policy: how long final Runs stay in the database before they are archived and pruned.

Settings (environment variables):

- ``HARNESS_RETENTION_DAYS``: keep final Runs this many days after their last change (unset: forever —
  nothing is archived unless asked);
- ``HARNESS_RETENTION_TENANTS``: per-tenant overrides, ``tenant=days`` comma-separated, ``never`` keeps a
  tenant's Runs forever (e.g. ``acme=30,audit-heavy=never``);
- ``HARNESS_ARCHIVE_BATCH``: at most this many Runs per segment (default 10000);
- ``HARNESS_ARCHIVE_INTERVAL_S``: how often `harness serve` and the Celery beat run an archive pass
  (default 3600; 0 turns the scheduled pass off).

Only final Runs are ever archived: a Run parked for approval, running, or in a transient state stays.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from harness.domain.errors import BadInputError

DAYS_ENV = "HARNESS_RETENTION_DAYS"
TENANTS_ENV = "HARNESS_RETENTION_TENANTS"
BATCH_ENV = "HARNESS_ARCHIVE_BATCH"
INTERVAL_ENV = "HARNESS_ARCHIVE_INTERVAL_S"
DAY_S = 86_400.0


class RetentionPolicy(BaseModel):
    """Days to keep final Runs, by default and per tenant (None: forever)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    days: float | None = Field(default=None, ge=0)
    tenants: dict[str, float | None] = Field(default_factory=dict)
    batch: int = Field(default=10_000, ge=1, le=1_000_000)
    interval_s: float = Field(default=3600.0, ge=0)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetentionPolicy:
        """The policy the environment sets; BadInputError naming the variable when a value is wrong."""
        env = os.environ if env is None else env
        return cls(days=_days(env.get(DAYS_ENV), DAYS_ENV), tenants=parse_tenants(env.get(TENANTS_ENV, "")),
                   batch=_int(env.get(BATCH_ENV), BATCH_ENV, 10_000),
                   interval_s=_float(env.get(INTERVAL_ENV), INTERVAL_ENV, 3600.0))

    def cutoffs(self, now: float) -> tuple[float | None, dict[str, float | None]]:
        """(default cutoff, per-tenant cutoffs): a final Run whose last change is before its cutoff goes."""
        def cut(days: float | None) -> float | None:
            return None if days is None else now - days * DAY_S

        return cut(self.days), {tenant: cut(days) for tenant, days in self.tenants.items()}

    def describe(self) -> str:
        """One line for people."""
        default = "forever" if self.days is None else f"{self.days:g} day(s)"
        extra = ", ".join(f"{t}: {'forever' if d is None else f'{d:g} day(s)'}"
                          for t, d in sorted(self.tenants.items()))
        return f"keep final Runs {default}" + (f" ({extra})" if extra else "")


def _days(value: str | None, name: str) -> float | None:
    if value is None or value.strip() == "" or value.strip().lower() == "never":
        return None
    days = _float(value, name, 0.0)
    if days < 0:
        raise BadInputError(f"{name}={value!r}: days cannot be negative")
    return days


def _float(value: str | None, name: str, default: float) -> float:
    if value is None or not value.strip():
        return default
    try:
        number = float(value)
    except ValueError:
        raise BadInputError(f"{name}={value!r} is not a number") from None
    if math.isnan(number) or math.isinf(number) or number < 0:
        raise BadInputError(f"{name}={value!r} must be a non-negative number")
    return number


def _int(value: str | None, name: str, default: int) -> int:
    if value is None or not value.strip():
        return default
    try:
        number = int(value)
    except ValueError:
        raise BadInputError(f"{name}={value!r} is not a whole number") from None
    if number < 1:
        raise BadInputError(f"{name}={value!r} must be at least 1")
    return number


def parse_tenants(text: str) -> dict[str, float | None]:
    """``acme=30,beta=never`` as {"acme": 30.0, "beta": None}."""
    out: dict[str, float | None] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        tenant, sep, days = part.partition("=")
        if not sep or not tenant.strip():
            raise BadInputError(f"{TENANTS_ENV}: {part!r} is not tenant=days")
        out[tenant.strip()] = _days(days, f"{TENANTS_ENV} ({tenant.strip()})")
    return out
