"""A worker's hold on a Run (SPEC K5b): the value the lease port hands out and takes back."""

from __future__ import annotations

from dataclasses import dataclass

from harness.kernel.states import RunState


@dataclass(frozen=True)
class Lease:
    """A worker's hold on a Run: who, which epoch, until when, and how many stalls preceded it."""

    run_id: str
    owner: str
    epoch: int
    expires_at: float
    stalls: int


@dataclass(frozen=True)
class Standing:
    """Where a Run stands for the drive that holds a lease on it, read in one go before a side effect:
    its state, and whether the lease is still the Run's current one and unexpired."""

    state: RunState
    held: bool
