"""The unit of work of a drive (commit at effect boundaries): what the pipeline tells the store about
where its effects are, so that the writes between two effects commit together."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol


class UnitOfWork(Protocol):
    """A drive's writes commit at its boundaries, not one by one."""

    def unit(self, run_id: str) -> AbstractContextManager[object]:
        """Open a unit of work for this thread's drive of the Run; opened again for the same Run it joins,
        for another Run (a child) it commits the outer one first. Its end is a boundary."""
        ...

    def effect(self) -> AbstractContextManager[None]:
        """A block that leaves the process (a model or tool call, a child Run): what the drive wrote
        commits before it, and inside it every write commits by itself."""
        ...

    def release(self) -> None:
        """Commit the drive's open transaction, if one is open, so that nothing is held during what comes
        next (an idempotent read-only call); deferred writes stay deferred."""
        ...

    def defer(self, write: Callable[[], None]) -> None:
        """Run `write` in the drive's next transaction (now when one is open, or outside a drive): for the
        results of calls that may run again, which ride with the next boundary."""
        ...

    def joined(self) -> bool:
        """Whether this thread's writes join a drive's open unit now: its next writes commit together, at
        the next boundary (False on another thread, inside an effect, outside a drive)."""
        ...

    def boundary(self) -> None:
        """Commit what the drive wrote since its last boundary: called before anything leaves the
        process (an LLM call, a tool call, a child Run, parallel steps) and before a Run is answered."""
        ...

    def after_commit(self, told: Callable[[], None]) -> None:
        """Run `told` once what was written so far is durable (now, when nothing is pending)."""
        ...
