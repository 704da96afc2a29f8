"""Where harness keeps files of its own when no setting says otherwise."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    """The data directory (HARNESS_DATA_DIR unset): `harness` in the user's data folder
    ($XDG_DATA_HOME, else ~/.local/share), never the folder a command happens to run in. Runs' working
    directories and the bundled example's ledger live there."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "harness"
