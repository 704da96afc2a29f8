"""Ports of the sandbox pool (seed 004 §3.4-3.5): where instances and their units are kept, and the
processes that hold a kept instance's namespaces.

The pool (harness.pipeline.sandbox_pool) decides which instance a call gets, within which limits, and how
long it waits; these ports only store and look. Units are taken in one transaction of the instance store,
so two processes racing for the last unit cannot both get it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from harness.domain.sandbox import Capacity, Claim, Holder, InstanceRow, PoolUse
    from harness.ports import Clock, Tx


class SandboxInstances(Protocol):
    """Instance rows and the units they hold (caps, ports), shared by every process on the database, and
    the Runs' audit trail the pool writes what happens to them into."""

    @property
    def clock(self) -> Clock:
        """The store's clock: instances are timed (leases, held seconds) on it."""
        ...

    def get(self, run_id: str, skill_id: str) -> InstanceRow | None:
        """The Run's instance for the skill, whatever its state; None when it never had one."""
        ...

    def acquire(self, claim: Claim, capacity: Capacity, now: float, lease_until: float) -> InstanceRow:
        """Take the claim's units and make its row live (a new row, or the next generation of an ended one)
        in one transaction. Raises ShortageError naming the first resource with too few free units."""
        ...

    def started(self, instance_id: str, pid: int | None, pid_start: int | None, now: float, *,
                new_generation: bool = False) -> InstanceRow:
        """Note the instance's process and count the call it starts for (and, for a re-creation that kept
        its units, the next generation)."""
        ...

    def touch(self, instance_id: str, now: float, lease_until: float) -> None:
        """Count a call and renew the instance's lease."""
        ...

    def end(self, tx: Tx, row: InstanceRow, state: str, reason: str, now: float) -> bool:
        """End a live instance (released or dead) and free its units within `tx`; False when it was no
        longer live (another process ended it first)."""
        ...

    def end_now(self, row: InstanceRow, state: str, reason: str, now: float) -> bool:
        """`end` in a transaction of its own."""
        ...

    def of_run(self, tx: Tx, run_id: str) -> list[InstanceRow]:
        """The Run's instances (any state), as `tx` sees them."""
        ...

    def mark_billed(self, tx: Tx, instance_id: str) -> None:
        """The instance's held seconds are in the Run's costs (within `tx`)."""
        ...

    def live(self, host: str | None = None, *, tenant_id: str | None = None) -> list[InstanceRow]:
        """Live instances, of one host (and one tenant) or of all, oldest first."""
        ...

    def ended_with_process(self, host: str) -> list[InstanceRow]:
        """Ended instances of this host whose process may still run (nobody has stopped it yet)."""
        ...

    def forget_process(self, instance_id: str, pid: int) -> None:
        """The ended instance's process is gone."""
        ...

    def renew(self, instance_ids: Sequence[str], until: float) -> None:
        """Extend the leases of instances whose process was seen alive."""
        ...

    def use(self) -> PoolUse:
        """What every host holds now."""
        ...

    def audit(self, run_id: str | None, event: str, actor: str, detail: dict[str, Any]) -> None:
        """Write one audit event of the Run in its own transaction."""
        ...

    def write_audit(self, tx: Tx, run_id: str | None, event: str, actor: str, detail: dict[str, Any]) -> None:
        """Write one audit event of the Run within `tx`."""
        ...


class InstanceProcesses(Protocol):
    """The processes holding kept instances' namespaces on this host."""

    def alive(self, holder: Holder) -> bool:
        """Whether the instance's process still runs (an instance without a process is always alive)."""
        ...

    def stop(self, holder: Holder) -> bool:
        """Kill the instance's process and wait until it is gone; True when it is gone."""
        ...
