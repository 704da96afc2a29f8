"""What travels with a remote sandbox call: the skill's code and the Run's working directory.

A sandbox server keeps files of its own; it does not see the harness host's. So the client packs the code a
call needs (the skill's folder, or a code skill's package; never the harness package, which the server has
itself) into one archive named by its SHA-256, which the server keeps under its data directory by that
name: the archive travels once per server. The files of the Run's working directory travel too, those the
server's copy lacks; the server runs the call in its copy and answers with the files the call created,
changed or deleted, which the client writes back into the Run's working directory. The artifacts a call
leaves, and the state a kept instance keeps between calls, are then the same as on this host.

Paths inside the job stay the client's: the server maps each root of the archive, and the harness package
(named `HARNESS` on the wire), to its own.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath

#: the most bytes of files a call may carry each way (the code archive, the working directory's files)
MAX_TRANSFER = 32 * 1024 * 1024
#: the harness package's folder and the folder it is imported from, as the wire names them
HARNESS, HARNESS_ROOT = "<harness>", "<harness-root>"
#: folders never packed with a skill's code
_SKIPPED = ("__pycache__",)


class TransferError(ValueError):
    """What a call carries is not acceptable: a path that leaves its folder, bytes that are not what they say."""


class TransferLimitError(TransferError):
    """What a call would carry is larger than MAX_TRANSFER."""


def harness_package() -> Path:
    """This process's harness package folder."""
    import harness

    return Path(harness.__file__).resolve().parent


def code_roots(entry_file: Path | None, code_paths: Sequence[Path], own: Path) -> list[Path]:
    """The folders (or files) whose code a call needs besides the harness package: its code paths, and the
    folder of its entry file where no code path holds it (what a local sandbox shows the call)."""
    roots = [p.resolve() for p in code_paths if not p.resolve().is_relative_to(own)]
    if entry_file is not None:
        folder = entry_file.resolve().parent
        if not any(folder.is_relative_to(r) for r in roots):
            roots.append(folder)
    return roots


def _files_of(root: Path) -> Iterable[Path]:
    if root.is_file():
        yield root
        return
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED and not d.startswith("."))
        for name in sorted(files):
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink() and not name.endswith(".pyc"):
                yield path


def code_signature(roots: Sequence[Path]) -> tuple[tuple[str, int, int], ...]:
    """(path, size, modification time) of every file `pack_code` would pack: equal while none changed."""
    out = []
    for root in roots:
        for path in _files_of(root):
            with contextlib.suppress(OSError):
                info = path.stat()
                out.append((str(path), info.st_size, info.st_mtime_ns))
    return tuple(out)


def pack_code(roots: Sequence[Path]) -> tuple[str, bytes]:
    """(SHA-256, archive) of the roots' files, the i-th root under `i/<its name>/`; the same files always
    give the same bytes (sorted, no times or owners). Raises TransferError past MAX_TRANSFER."""
    raw = io.BytesIO()
    size = 0
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
        for index, root in enumerate(roots):
            for path in _files_of(root):
                data = path.read_bytes()
                size += len(data)
                if size > MAX_TRANSFER:
                    raise TransferLimitError(f"the skill's code under {root} is larger than {MAX_TRANSFER} bytes, "
                                             "the most a remote sandbox call carries")
                name = root.name if path == root else f"{root.name}/{path.relative_to(root).as_posix()}"
                info = tarfile.TarInfo(f"{index}/{name}")
                info.size, info.mode = len(data), 0o755 if os.access(path, os.X_OK) else 0o644
                tar.addfile(info, io.BytesIO(data))
    archive = raw.getvalue()
    return hashlib.sha256(archive).hexdigest(), archive


def unpack_code(archive: bytes, digest: str, into: Path) -> Path:
    """The folder the archive named `digest` is unpacked in under `into` (unpacked once; kept). Raises
    TransferError when the bytes are not that archive or name a path outside it."""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise TransferError(f"not a code digest: {digest!r}")
    target = into / digest
    if target.is_dir():
        return target
    if hashlib.sha256(archive).hexdigest() != digest:
        raise TransferError(f"the code archive does not match its digest {digest}")
    into.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=into, prefix=".unpack-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            tar.extractall(staging, filter="data")  # refuses absolute paths, "..", links out, devices
        with contextlib.suppress(OSError):  # another request unpacked the same archive first
            staging.rename(target)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise TransferError(f"the code archive {digest} cannot be unpacked: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def manifest(folder: Path) -> dict[str, str]:
    """{path relative to the folder: SHA-256} of the folder's regular files (links are not followed)."""
    found: dict[str, str] = {}
    if not folder.is_dir():
        return found
    for parent, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = Path(parent, name)
            if path.is_file() and not path.is_symlink():
                with contextlib.suppress(OSError):  # gone meanwhile
                    found[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _inside(folder: Path, relative: str) -> Path:
    """The folder's file at `relative`; TransferError when the path would leave the folder, by its name or
    through a link a skill left in the folder (a link to / would let the next write land anywhere)."""
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or ".." in pure.parts or "\0" in relative:
        raise TransferError(f"not a path inside the working directory: {relative!r}")
    path = folder.joinpath(*pure.parts)
    if path.is_symlink() or not path.parent.resolve().is_relative_to(folder.resolve()):
        raise TransferError(f"not a path inside the working directory: {relative!r} goes through a link")
    return path


def read_files(folder: Path, names: Iterable[str]) -> dict[str, str]:
    """{name: base64 of its bytes} of the folder's files; TransferError past MAX_TRANSFER."""
    out: dict[str, str] = {}
    size = 0
    for name in names:
        data = _inside(folder, name).read_bytes()
        size += len(data)
        if size > MAX_TRANSFER:
            raise TransferLimitError(f"the working directory's files to send are larger than {MAX_TRANSFER} bytes, the "
                                "most a remote sandbox call carries")
        out[name] = base64.b64encode(data).decode()
    return out


def write_files(folder: Path, files: Mapping[str, str], deleted: Iterable[str] = ()) -> None:
    """Write the files (base64) into the folder, each whole or not at all, and remove the deleted ones."""
    for name, encoded in files.items():
        path = _inside(folder, name)
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise TransferError(f"the file {name!r} is not base64") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    for name in deleted:
        with contextlib.suppress(FileNotFoundError):
            _inside(folder, name).unlink()
