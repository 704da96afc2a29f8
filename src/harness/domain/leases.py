"""A worker's hold on a Run (SPEC K5b): the value the lease port hands out and takes back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lease:
    """A worker's hold on a Run: who, which epoch, until when, and how many stalls preceded it."""

    run_id: str
    owner: str
    epoch: int
    expires_at: float
    stalls: int
