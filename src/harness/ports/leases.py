"""The lease port (SPEC K5b): which driver holds a Run, proven before every write and side effect."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from harness.domain.records import RunRecord


class HeldLease(Protocol):
    """A driver's hold on a Run: who, which epoch, until when, and how many stalls preceded it."""

    @property
    def run_id(self) -> str: ...

    @property
    def owner(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    @property
    def stalls(self) -> int: ...


LeaseT = TypeVar("LeaseT", bound=HeldLease)


class LeaseKeeper(Protocol[LeaseT]):
    """Acquire, heartbeat, check and release Run leases that live `ttl_s` without a heartbeat."""

    @property
    def ttl_s(self) -> float: ...

    def acquire(self, run_id: str, owner: str) -> LeaseT | None:
        """Take the Run's lease if it is free or expired (a takeover counts a stall); None if held."""
        ...

    def heartbeat(self, lease: LeaseT) -> LeaseT | None:
        """Extend the lease; None when it was taken over."""
        ...

    def holds(self, lease: LeaseT) -> bool:
        """Whether the lease is still the Run's current one and unexpired."""
        ...

    def release(self, lease: LeaseT) -> None:
        """Give the lease up."""
        ...


class RunLookup(Protocol):
    """Reads a Run by id."""

    def get_run(self, run_id: str) -> RunRecord:
        """The Run; UnknownRunError when there is none."""
        ...
