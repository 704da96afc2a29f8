"""Where the audit trail's checkpoints live, and the environment variables that name them and the witnesses.

Constants and one path rule, with no import of the audit code: the command line names them in its options
(which `harness --help` reads) without loading the signing and hashing behind them.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DIR = "harness-checkpoints"
DIR_ENV = "HARNESS_CHECKPOINT_DIR"
WITNESS_ENV = "HARNESS_CHECKPOINT_WITNESS"
TOKEN_ENV = "HARNESS_WITNESS_TOKEN"


def checkpoint_dir(option: str | Path | None = None, database_id: str | None = None) -> Path:
    """The checkpoint directory: the option, HARNESS_CHECKPOINT_DIR, else ./harness-checkpoints/<database
    id> (./harness-checkpoints itself when no database is named: the layout of earlier versions)."""
    chosen = option or os.environ.get(DIR_ENV)
    if chosen:
        return Path(chosen).expanduser()
    return Path(DEFAULT_DIR) / database_id if database_id else Path(DEFAULT_DIR)
