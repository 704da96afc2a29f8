"""Per-Run private working directories for sandboxed calls (SPEC T4), as the tool controller uses them."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Workdirs(Protocol):
    """The folders under one root, one per Run."""

    @property
    def root(self) -> Path:
        """The folder the Runs' directories are in."""
        ...

    def path(self, run_id: str) -> Path:
        """Where the Run's directory is (whether or not it exists yet); ValueError for an unusable id."""
        ...

    def ensure(self, run_id: str) -> Path:
        """The Run's directory, created private if it is missing; an absolute path."""
        ...

    def run_ids(self, limit: int) -> list[str]:
        """The Runs that have a directory here (at most `limit` of them)."""
        ...

    def remove(self, run_id: str) -> bool:
        """Delete the Run's directory; False when there was none. Never raises."""
        ...
