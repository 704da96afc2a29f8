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

    def stamps(self, run_id: str) -> dict[str, tuple[int, int]]:
        """Each regular file in the Run's directory (symlinks are not followed, nor listed), by its path
        relative to the directory: (size in bytes, modification time in ns). {} when there is no directory."""
        ...

    def read_file(self, run_id: str, name: str, limit: int) -> bytes:
        """The bytes of the regular file `name` (relative) in the Run's directory, never through a symlink
        and never outside the directory; OSError when it is not such a file, is linked elsewhere too, or
        holds more than `limit` bytes."""
        ...
