"""Ports of the Run store as the pipeline sees it: reads of a Run's state, and its leases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from harness.domain.leases import Lease
    from harness.domain.records import TransitionRow
    from harness.kernel import RunState


class RunReads(Protocol):
    """Where a Run stands, read outside any transaction."""

    def state_of(self, run_id: str) -> RunState:
        """The Run's current state (UnknownRunError if there is no such Run)."""
        ...

    def transitions_of(self, run_id: str) -> list[TransitionRow]:
        """The Run's state changes, oldest first."""
        ...


class RunLeases(Protocol):
    """Which driver holds a Run (SPEC K5b): taken when free or expired, heartbeated, given back."""

    @property
    def ttl_s(self) -> float:
        """How long a lease lives without a heartbeat."""
        ...

    def acquire(self, run_id: str, owner: str) -> Lease | None:
        """Take the Run's lease if it is free or expired; None while another holder has it."""
        ...

    def heartbeat(self, lease: Lease) -> Lease | None:
        """Extend the lease; None when it was taken over."""
        ...

    def release(self, lease: Lease) -> None:
        """Give the lease up."""
        ...
