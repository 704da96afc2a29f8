"""A duration a deployment sets (a timeout, an interval, a lease, a threshold): a number of seconds above 0
(or 0 where 0 means "never"), at most MAX_DURATION_S (366 days). Infinity, NaN or a number like 1e300 is
refused where the setting is read, naming it, not met later as an overflow in a timer or a date."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from harness.kernel.thresholds import MAX_DURATION_S

#: seconds above 0, at most MAX_DURATION_S
Seconds = Annotated[float, Field(gt=0, le=MAX_DURATION_S)]
#: seconds from 0 (a setting for which 0 means "at once" or "never"), at most MAX_DURATION_S
SecondsOrZero = Annotated[float, Field(ge=0, le=MAX_DURATION_S)]
