"""The sandbox server's own storage (`harness sandbox serve --data-dir`): the code archives it was sent,
unpacked once by their SHA-256, and a working directory per Run; and the job a client sent, made this host's.

A job arrives naming the client's paths. Each root of its code archive is mapped to where the archive is
unpacked here, the harness package to this process's own, and the working directory to the Run's folder
here, after the files the client sent are written into it. What the call then changed travels back
(harness.adapters.sandbox.shipping). A Run's folder is removed once nothing touched it for `keep_s`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.adapters.sandbox.shipping import (
    HARNESS,
    HARNESS_ROOT,
    MAX_TRANSFER,
    TransferError,
    TransferLimitError,
    harness_package,
    manifest,
    read_files,
    unpack_code,
    write_files,
)
from harness.adapters.sandbox.wire import job_from_json
from harness.adapters.sandbox.workdirs import Workdirs
from harness.domain.sandbox import SandboxJob, SandboxOutcome

#: how long a Run's folder is kept after its last call, by default (a Run may wait days for a human)
KEEP_S = 30 * 24 * 3600.0
#: how often old folders are looked for
PRUNE_EVERY_S = 600.0


class MissingError(Exception):
    """The server lacks what the job names and the client did not send: "code" or "files"."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


@dataclass(frozen=True)
class Arrived:
    """A job made this host's: the job, and the Run's folder's files as the client last knew them."""

    job: SandboxJob
    known: dict[str, str]


class Yard:
    """Code archives and Runs' working directories under one folder."""

    def __init__(self, root: Path, *, keep_s: float = KEEP_S) -> None:
        self.root = root.resolve()
        self.workdirs = Workdirs(self.root / "runs")
        self.keep_s = keep_s
        self.own = harness_package()
        self._pruned = 0.0
        self._lock = threading.Lock()

    def receive(self, data: dict[str, Any]) -> Arrived:
        """The job in `data` with this host's paths, its code unpacked and its files written. Raises
        MissingError, TransferError (the request is refused) or ValueError (not a job)."""
        self._prune_now_and_then()
        mapped = self._code(data.get("code"))
        job = dict(data)
        if job.get("entry_file"):
            entry = _translate(str(job["entry_file"]), mapped, self.own)
            if entry is None:
                raise ValueError(f"the entry file {job['entry_file']} is not in the code sent")
            job["entry_file"] = str(entry)
        for key in ("code_paths", "python_path"):
            job[key] = [str(p) for p in (_translate(str(q), mapped, self.own) for q in job.get(key) or ()) if p]
        context = job.get("context")
        if not isinstance(context, dict) or not isinstance(context.get("run_id"), str):
            raise ValueError("the job's context names no run_id")
        folder = self.workdirs.ensure(context["run_id"])
        os.utime(folder)  # touched: kept another keep_s
        known = self._files(folder, job.pop("files", None))
        job["workdir"], job["context"] = str(folder), {**context, "workdir": str(folder)}
        return Arrived(job_from_json(job), known)

    def changes(self, arrived: Arrived, outcome: SandboxOutcome) -> tuple[SandboxOutcome, dict[str, Any]]:
        """What the call changed in the Run's folder, against what the client knew: (the outcome, or a
        failure when the changes are too large to send back; the changes as the wire has them)."""
        now = manifest(arrived.job.workdir)
        changed = [name for name, digest in now.items() if arrived.known.get(name) != digest]
        deleted = [name for name in arrived.known if name not in now]
        try:
            files = read_files(arrived.job.workdir, changed)
        except TransferLimitError as exc:
            failed = SandboxOutcome(ok=False, isolation=outcome.isolation, error_code="sandbox_transfer_limit",
                                    message=f"{exc} (the call's own outcome: {outcome.error_code or 'ok'})",
                                    stdout=outcome.stdout, stderr=outcome.stderr, duration_ms=outcome.duration_ms)
            return failed, {"changed": {}, "deleted": [], "manifest": arrived.known}
        except FileNotFoundError:  # removed meanwhile (a parallel call of the Run): the next answer says so
            files = read_files(arrived.job.workdir, [n for n in changed if (arrived.job.workdir / n).is_file()])
        return outcome, {"changed": files, "deleted": deleted, "manifest": now}

    def _code(self, code: Any) -> dict[str, Path]:
        """{root as the client named it: where it is here} for the job's code archive (none: {})."""
        if code is None:
            return {}
        if not isinstance(code, dict) or not isinstance(code.get("digest"), str):
            raise ValueError("the job's code names no digest")
        digest, roots = code["digest"], code.get("roots") or []
        folder = self.root / "code" / digest
        if not folder.is_dir():
            if not isinstance(code.get("archive"), str):
                raise MissingError("code", f"the code archive {digest} is not on this server; send it")
            try:
                archive = base64.b64decode(code["archive"], validate=True)
            except (binascii.Error, ValueError):
                raise TransferError("the code archive is not base64") from None
            if len(archive) > MAX_TRANSFER:
                raise TransferLimitError(f"the code archive is larger than {MAX_TRANSFER} bytes")
            folder = unpack_code(archive, digest, self.root / "code")
        return {str(root): folder / str(i) / Path(str(root)).name for i, root in enumerate(roots)}

    def _files(self, folder: Path, files: Any) -> dict[str, str]:
        """Write the files the client sent; the folder's files as the client knows them (its manifest).
        Raises MissingError when a file the client counts on is not here as it has it."""
        if files is None:
            return manifest(folder)
        if not isinstance(files, dict):
            raise ValueError("the job's files are not an object")
        known = {str(k): str(v) for k, v in dict(files.get("manifest") or {}).items()}
        sent = dict(files.get("send") or {})
        write_files(folder, sent)
        for name, digest in known.items():
            if name not in sent and _digest(folder / name) != digest:
                raise MissingError("files", f"the Run's file {name} is not on this server as the client has it; "
                                            "send the working directory")
        return known

    def _prune_now_and_then(self) -> None:
        with self._lock:
            if time.monotonic() - self._pruned < PRUNE_EVERY_S:
                return
            self._pruned = time.monotonic()
        cutoff = time.time() - self.keep_s
        for run_id in self.workdirs.run_ids(100_000):
            try:
                touched = self.workdirs.path(run_id).stat().st_mtime
            except OSError:
                continue
            if touched < cutoff:
                self.workdirs.remove(run_id)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _translate(path: str, mapped: dict[str, Path], own: Path) -> Path | None:
    """The client's path as this host has it: a root of the code archive (or a path inside one, or the
    folder a root is imported from), or the harness package; None when the job sent nothing there."""
    if path == HARNESS:
        return own
    if path == HARNESS_ROOT:
        return own.parent
    wanted = Path(path)
    for root, here in mapped.items():
        if wanted == Path(root).parent:
            return here.parent
        if wanted.is_relative_to(root):
            return here / wanted.relative_to(root)
    return None
