"""The hash chain over trace records (SPEC A3). Pure functions over canonical bytes.

A record's canonical bytes are the compact JSON array
``[seq, record_id, run_id, kind, prev_hash, payload]`` (payload is the stored text, verbatim),
UTF-8 encoded. Its hash is SHA-256 over those bytes, so each record commits to its predecessor.
The same bytes are the leaf data of the Merkle tree (harness.audit.merkle).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

GENESIS_HASH = "0" * 64
_RECORD_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """The one serialisation used wherever a hash is taken: sorted keys, no spaces, UTF-8."""
    return _CANONICAL.encode(value)


#: what the encoder writes for a str when ensure_ascii is False (the C implementation where there is one)
_JSON_STRING = json.encoder.encode_basestring


def record_bytes(seq: int, record_id: str, run_id: str | None, kind: str, prev_hash: str, payload: str) -> bytes:
    """The canonical bytes of one trace record: exactly what `_RECORD_ENCODER.encode([...])` writes (the
    same string escaping, an int as its repr), assembled directly, which is ~3x quicker for the ~25
    records every Run chains."""
    if type(seq) is not int:  # a bool or an int subclass would encode differently
        return _RECORD_ENCODER.encode([seq, record_id, run_id or "", kind, prev_hash, payload]).encode("utf-8")
    s = _JSON_STRING
    return f"[{seq},{s(record_id)},{s(run_id or '')},{s(kind)},{s(prev_hash)},{s(payload)}]".encode()


def record_hash(seq: int, record_id: str, run_id: str | None, kind: str, prev_hash: str, payload: str) -> str:
    """SHA-256 (hex) of a record's canonical bytes."""
    return hashlib.sha256(record_bytes(seq, record_id, run_id, kind, prev_hash, payload)).hexdigest()


def content_hash(value: Any) -> str:
    """Hash of any JSON value, used to reference inputs and outputs by hash (SPEC A1)."""
    return text_hash(canonical_json(value))


def text_hash(canonical: str) -> str:
    """`content_hash` of the value whose canonical JSON is `canonical` (when that text is at hand anyway)."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
