"""Per-Run private working directories for sandboxed calls (SPEC T4).

A Run's directory is created at its first sandboxed call, kept while the Run waits for a human, and
removed when the Run reaches its final state (the composition root wires `remove` to the state
machine). Run ids are checked before they become paths, so no id can name a folder outside the root.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class Workdirs:
    """The folders under one root, one per Run."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, run_id: str) -> Path:
        """Where the Run's directory is (whether or not it exists yet)."""
        if not _SAFE_ID.match(run_id) or run_id in (".", ".."):
            raise ValueError(f"not a usable run id for a working directory: {run_id!r}")
        return self.root / run_id

    def ensure(self, run_id: str) -> Path:
        """The Run's directory, created private (0700) if it is missing; an absolute path."""
        path = self.path(run_id).resolve()
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def run_ids(self, limit: int) -> list[str]:
        """The Runs that have a directory here (at most `limit` of them)."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in os.scandir(self.root):
            if entry.is_dir(follow_symlinks=False) and _SAFE_ID.match(entry.name):
                found.append(entry.name)
                if len(found) >= limit:
                    break
        return found

    def remove(self, run_id: str) -> bool:
        """Delete the Run's directory and all it holds; False when there was none (or the id could
        never have had one) — it is called for every Run that closes, and must never raise."""
        try:
            path = self.path(run_id)
        except ValueError:
            return False
        if not path.exists():
            return False
        shutil.rmtree(path, ignore_errors=True)
        return not path.exists()
