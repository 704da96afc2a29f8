"""Per-Run private working directories for sandboxed calls (SPEC T4).

A Run's directory is created at its first sandboxed call, kept while the Run waits for a human, and
removed when the Run reaches its final state (the composition root wires `remove` to the state
machine). Run ids are checked before they become paths, so no id can name a folder outside the root.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
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

    def stamps(self, run_id: str) -> dict[str, tuple[int, int]]:
        """Each regular file in the Run's directory (symlinks are not followed, nor listed), by its path
        relative to the directory: (size in bytes, modification time in ns). {} when there is no directory."""
        root = self.path(run_id)
        found: dict[str, tuple[int, int]] = {}
        for folder, _dirs, files in os.walk(root):  # does not follow symlinked folders
            for name in files:
                path = os.path.join(folder, name)
                try:
                    info = os.lstat(path)
                except OSError:  # gone since the listing
                    continue
                if stat.S_ISREG(info.st_mode):
                    found[os.path.relpath(path, root)] = (info.st_size, info.st_mtime_ns)
        return found

    def read_file(self, run_id: str, name: str, limit: int) -> bytes:
        """The bytes of the regular file `name` (relative) in the Run's directory, never through a symlink
        and never outside the directory; OSError when it is not such a file, is linked elsewhere too, or
        holds more than `limit` bytes."""
        root = self.path(run_id).resolve()
        fd = os.open(root / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            info = os.fstat(fd)
            # a folder on the way swapped for a symlink since the listing is caught here: where the file
            # really is, as the kernel opened it
            where = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if root not in where.parents:
                raise OSError(errno.EXDEV, f"{name} is not inside the Run's working directory")
            if not stat.S_ISREG(info.st_mode):
                raise OSError(errno.EINVAL, f"{name} is not a regular file")
            if info.st_nlink > 1:  # a hard link could name a file the skill was never given
                raise OSError(errno.EMLINK, f"{name} has other links besides this one")
            if info.st_size > limit:
                raise OSError(errno.EFBIG, f"{name} holds {info.st_size} bytes, more than {limit}")
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read(limit + 1)
            if len(data) > limit:
                raise OSError(errno.EFBIG, f"{name} grew past {limit} bytes while it was read")
            return data
        finally:
            os.close(fd)
