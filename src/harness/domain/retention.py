"""Retention values: what the database keeps of an archived, pruned Run (where its segment is), what a
prune and an erasure did, and the pure pieces of an erasure (the pseudonym, the redacted payload)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from harness.domain.chain import canonical_json

#: the audit event that fixes an archive segment's id, counts and digest (its manifest record)
ARCHIVE_SEGMENT = "archive_segment"


@dataclass(frozen=True, slots=True)
class ArchivedRun:
    """An archived, pruned Run and the segment that holds it."""

    run_id: str
    segment_id: str
    tenant_id: str
    state: str
    created_at: float
    closed_at: float
    archived_at: float
    location: str
    checkpoint: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document."""
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass
class PruneResult:
    """What one prune did."""

    runs: int = 0
    records: int = 0
    kept: list[str] = field(default_factory=list)


@dataclass
class LiveErasure:
    """What the erasure did in the database."""

    runs: int = 0
    records: int = 0
    memory_entries: int = 0
    still_running: tuple[str, ...] = ()
    #: the SHA-256s the Runs' records named (among them the blobs they reference)
    contents: set[str] = field(default_factory=set)


def swap_ids(value: Any, user_id: str, subject: str) -> Any:
    """`value` with every string equal to the person's id replaced by the pseudonym; a session id goes too."""
    if isinstance(value, dict):
        return {k: subject if k == "session_id" and v is not None else swap_ids(v, user_id, subject)
                for k, v in value.items()}
    if isinstance(value, list):
        return [swap_ids(v, user_id, subject) for v in value]
    return subject if value == user_id else value


def pseudonym(salt: bytes, tenant_id: str, user_id: str) -> str:
    """The salted hash that replaces a person's id."""
    return "erased-" + hashlib.sha256(salt + f"{tenant_id}/{user_id}".encode()).hexdigest()[:32]


def redacted_payload(salt: bytes, erase_id: str, payload: str) -> str:
    """What replaces a record's payload."""
    return canonical_json({"erased": erase_id,
                           "salted_sha256": hashlib.sha256(salt + payload.encode("utf-8")).hexdigest()})


#: how a record's payload names a blob: its SHA-256 in hex
_HASH = re.compile(r"[0-9a-f]{64}")


def hashes_in(payload: str) -> set[str]:
    """Every SHA-256 (hex) a payload names: the blobs a record references are among them."""
    return set(_HASH.findall(payload))
