"""What a sandboxed call leaves besides its output (seed 004 §4.3): what it printed, and the files it wrote.

The files are those of the Run's working directory that are new or changed since the call started (a
listing before, one after). Each is kept by content hash: a stored document (`{"artifact": <SHA-256 of
the bytes>, "base64": …}`) in the blob store, written with the step's result and noted as the Run's
(so an erasure of the Run's person deletes it with the rest), and listed in the step's outcome by name,
size, media type and hash. Where a file store is configured (a directory or an S3-compatible bucket, the
segment store's kinds), the bytes go there instead, as an object of their own written for this call, and
the document names its location (`{"artifact": …, "location": …}`); an erasure deletes the object too.
Bounds are settings: a file over the size bound, or past the count bound, is not kept and the outcome
says why.

Secrets (SPEC C4, outputs too): the streams are filtered like the skill's output, and so is a text file
(UTF-8 of a text media type) before it is stored — its bytes, size and hash are then the filtered file's,
marked `filtered`. A binary file is kept as written.
"""

from __future__ import annotations

import base64
import hashlib
import json
import mimetypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.domain.chain import content_hash, text_hash
from harness.domain.contracts import ArtifactFile, SkippedFile
from harness.domain.ids import ordered_id
from harness.ports.contents import StoredContents
from harness.ports.segments import SegmentLocator, SegmentStore, SegmentStoreError
from harness.ports.workdirs import Workdirs

Stamps = dict[str, tuple[int, int]]
#: media types besides text/* whose files are text, and filtered for secrets before they are stored
TEXT_TYPES = frozenset({"application/json", "application/xml", "application/yaml", "application/x-yaml",
                        "application/javascript", "application/x-sh", "application/sql", "application/toml"})
#: a stored file's media type when its name says none
OCTET_STREAM = "application/octet-stream"
#: what a stream shows when the secret filter failed on it
WITHHELD = "(withheld: the secret filter failed on it)"


@dataclass(frozen=True)
class ArtifactLimits:
    """How large a file a call may leave (bytes) and how many it may leave; the rest are listed as skipped."""

    max_bytes: int = 10 * 1024 * 1024
    max_count: int = 20


@dataclass
class Leftovers:
    """What one call left: its streams (filtered), the files kept and skipped, and the contents to store."""

    stdout: str | None = None
    stderr: str | None = None
    files: list[ArtifactFile] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    contents: list[dict[str, str]] = field(default_factory=list)


def media_type(name: str) -> str:
    """The media type a file's name says (`report.csv` → text/csv), or application/octet-stream."""
    guessed, _ = mimetypes.guess_type(name, strict=False)
    return guessed or OCTET_STREAM


def is_text(kind: str) -> bool:
    """Whether files of this media type are text (and so filtered for secrets)."""
    return kind.startswith("text/") or kind in TEXT_TYPES or kind.endswith(("+json", "+xml"))


def changed(before: Stamps, after: Stamps) -> list[str]:
    """The files that are new or changed (size or modification time) between two listings, by name."""
    return sorted(name for name, stamp in after.items() if before.get(name) != stamp)


def stored_document(data: bytes) -> dict[str, str]:
    """The content a file is stored as: its bytes in base64, with their SHA-256 (what a download checks)."""
    return {"artifact": hashlib.sha256(data).hexdigest(), "base64": base64.b64encode(data).decode("ascii")}


def file_bytes(document: Any, sha256: str, locate: SegmentLocator | None = None) -> bytes | None:
    """The bytes of a stored file's document — held in it, or in the file store at the location it names
    (read through `locate`) —, or None when they are gone or are not the file with this SHA-256."""
    if not isinstance(document, dict) or document.get("artifact") != sha256:
        return None
    location = document.get("location")
    try:
        if isinstance(location, str):
            if locate is None:
                return None
            data = locate(location).get(location)
        else:
            data = base64.b64decode(str(document.get("base64", "")), validate=True)
    except (ValueError, SegmentStoreError):
        return None
    return data if hashlib.sha256(data).hexdigest() == sha256 else None


def files_of(context: dict[str, Any] | None) -> list[ArtifactFile]:
    """Every file the Run's steps kept, in the order of its rounds and steps (the RunContext's record)."""
    return [ArtifactFile.model_validate(f) for outcome in _outcomes(context) for f in outcome.get("files", ())]


def skipped_files_of(context: dict[str, Any] | None) -> list[SkippedFile]:
    """Every file the Run's steps wrote and did not keep, with the reason, in the order of its steps."""
    return [SkippedFile.model_validate(s) for outcome in _outcomes(context) for s in outcome.get("skipped_files", ())]


def _outcomes(context: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The recorded outcome of every step of every round, in order."""
    context = context or {}
    rounds = [*(r.get("steps", {}) for r in context.get("rounds", ())), context.get("steps", {})]
    return [outcome for steps in rounds for outcome in steps.values()]


def streams_of(context: dict[str, Any] | None) -> dict[str, dict[str, str]]:
    """What each step's sandboxed call printed (filtered, bounded), by step id: `stdout` and `stderr` where
    it printed something; steps that printed nothing are left out."""
    found: dict[str, dict[str, str]] = {}
    for outcome in _outcomes(context):
        printed = {k: str(outcome[k]) for k in ("stdout", "stderr") if outcome.get(k)}
        if printed:
            found[str(outcome.get("step_id"))] = printed
    return found


def find_file(context: dict[str, Any] | None, sha256: str) -> ArtifactFile | None:
    """The Run's file with these bytes (its first, when several names hold them), or None."""
    return next((f for f in files_of(context) if f.sha256 == sha256), None)


def stored_bytes(contents: StoredContents, file: ArtifactFile,
                 locate: SegmentLocator | None = None) -> bytes | None:
    """The bytes of a kept file, read back (from the file store through `locate` when it was kept there) and
    checked against both its hashes; None when its content is gone (erased) or is not what was kept."""
    text = contents.raw([file.content_hash]).get(file.content_hash)
    if text is None or text_hash(text) != file.content_hash:
        return None
    try:
        document = json.loads(text)
    except ValueError:
        return None
    return file_bytes(document, file.sha256, locate)


class Collector:
    """Collects what a sandboxed call left, within the limits, through the secret filter."""

    def __init__(self, workdirs: Workdirs, limits: ArtifactLimits | None = None,
                 scrub: Callable[[str], str] | None = None, store: SegmentStore | None = None) -> None:
        self.workdirs = workdirs
        self.limits = limits or ArtifactLimits()
        #: where the files' bytes go (a directory or an S3-compatible bucket); None: into the blob store
        self.store = store
        #: the context assembler's secret filter (text in, text out; raises when it cannot be sure)
        self.scrub = scrub

    def stamps(self, run_id: str) -> Stamps:
        """The listing of the Run's working directory before a call."""
        return self.workdirs.stamps(run_id)

    def collect(self, run_id: str, step_id: str, before: Stamps, stdout: str, stderr: str) -> Leftovers:
        """The call's streams, filtered, and the files it wrote since `before`, kept or skipped."""
        left = Leftovers(stdout=self._text(stdout) if stdout else None,
                         stderr=self._text(stderr) if stderr else None)
        after = self.workdirs.stamps(run_id)
        for name in changed(before, after):
            size = after[name][0]
            reason: str | None
            if len(left.files) >= self.limits.max_count:
                reason = f"the call already left {self.limits.max_count} files, the most kept per call " \
                         "(HARNESS_ARTIFACT_MAX_COUNT)"
            elif size > self.limits.max_bytes:
                reason = f"{size} bytes is more than the {self.limits.max_bytes} kept per file " \
                         "(HARNESS_ARTIFACT_MAX_BYTES)"
            else:
                reason = self._keep(left, run_id, step_id, name)
            if reason is not None:
                left.skipped.append(SkippedFile(step_id=step_id, name=name, size=size, reason=reason))
        return left

    def _keep(self, left: Leftovers, run_id: str, step_id: str, name: str) -> str | None:
        """Store one file in `left`; why it was not kept otherwise."""
        try:
            data = self.workdirs.read_file(run_id, name, self.limits.max_bytes)
        except OSError as exc:
            return f"not kept: {exc.strerror or exc}"
        kind, filtered = media_type(name), False
        text = _utf8(data) if is_text(kind) and self.scrub is not None else None
        if text is not None and self.scrub is not None:
            try:
                clean = self.scrub(text)
            except Exception:  # a file that cannot be filtered is not kept
                return "not kept: the secret filter failed on it"
            filtered = clean != text
            data = clean.encode("utf-8")
        document = stored_document(data)
        if self.store is not None:
            try:  # a name of its own: the object is this call's, and an erasure of its Run deletes it
                location = self.store.put(f"{document['artifact']}.{ordered_id()}", data)
            except SegmentStoreError as exc:
                return f"not kept: the file store refused it: {exc}"
            document = {"artifact": document["artifact"], "location": location}
        left.contents.append(document)
        left.files.append(ArtifactFile(step_id=step_id, name=name, size=len(data), media_type=kind,
                                       sha256=document["artifact"], content_hash=content_hash(document),
                                       filtered=filtered))
        return None

    def _text(self, text: str) -> str:
        if self.scrub is None:
            return text
        try:
            return self.scrub(text)
        except Exception:  # a stream that cannot be filtered is not kept
            return WITHHELD


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
