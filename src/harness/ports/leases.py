"""The lease port (SPEC K5b): which driver holds a Run, proven before every write and side effect.

One port for every holder: the leased drive of a worker, and a parent that waits for its child Run
without a drive of its own. The lease it hands out is the domain's value (`harness.domain.leases.Lease`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from harness.domain.leases import Lease, Standing
    from harness.domain.records import RunRecord


class RunLeases(Protocol):
    """Acquire, heartbeat, check and release Run leases that live `ttl_s` without a heartbeat."""

    @property
    def ttl_s(self) -> float:
        """How long a lease lives without a heartbeat."""
        ...

    def acquire(self, run_id: str, owner: str, *, to_drive: bool = False) -> Lease | None:
        """Take the Run's lease if it is free or expired (a takeover counts a stall); None while held, or,
        `to_drive`, while the Run is final or waiting for a human (or when there is no such Run)."""
        ...

    def heartbeat(self, lease: Lease, *, waiting: bool = False) -> Lease | None:
        """Extend the lease, saying whether the holder's drive waits on a call outside the process (a
        takeover while it does counts no stall); None when it was taken over."""
        ...

    def holds(self, lease: Lease) -> bool:
        """Whether the lease is still the Run's current one and unexpired."""
        ...

    def standing(self, lease: Lease) -> Standing:
        """The Run's state and whether the lease still holds, in one read (the check between steps)."""
        ...

    def release(self, lease: Lease) -> None:
        """Give the lease up."""
        ...


class RunLookup(Protocol):
    """Reads a Run by id."""

    def get_run(self, run_id: str) -> RunRecord:
        """The Run; UnknownRunError when there is none."""
        ...
