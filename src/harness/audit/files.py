"""Files that are written once and never changed: checkpoints and their witnesses' copies (SPEC A3b)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from harness.audit.keys import CheckpointError


def write_new(path: Path, data: bytes) -> None:
    """Write a file that must not exist yet, all or nothing and durably: a partial file never appears at
    `path`, and an existing one is never replaced (CheckpointError: another publisher was first)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(tmp, path)  # fails if `path` exists: checkpoints are never overwritten
    except FileExistsError:
        raise CheckpointError(f"{path} exists: checkpoints are immutable (another publisher?)") from None
    finally:
        tmp.unlink()
    path.chmod(0o444)


def json_load(path: Path) -> Any:
    """Parse a JSON file, naming it in the error."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None


def json_dumps(doc: Any) -> str:
    """Checkpoint and export files: indented, keys sorted, so they diff well."""
    return json.dumps(doc, indent=2, sort_keys=True)
