"""What a RunTrace commits to about the Run's other records (SPEC A1, A3b): a complete export is provable.

Records are chained after the transaction that wrote them commits, so a RunTrace cannot name hashes
or positions in the chain. It names instead the id and kind of every record of the Run written before
it or with it (the closing transaction's final transition, its audit events, the closing hooks'
records): a record's content is proven by its inclusion proof against a signed checkpoint, and which
records the Run had is proven by this list, itself a chained, proven payload. A verifier holding an
export can then tell a withheld record from a record written after the Run closed (an audit of a late
cancel), and name the missing one's id and kind.

The list is kept small (it is written once per Run): ids are the UUIDs every record gets
(harness.domain.ids.ordered_id), 16 raw bytes each, concatenated in sorted order and base64-encoded per kind.
An id that is not a UUID (never written by harness itself) is listed as it is, under ``other``.

Standard library only: the standalone verifier imports this module.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

#: the RunTrace payload key holding the commitment, and its format version
RECORDS_KEY = "records"
RUN_TRACE_VERSION = 2
_ID_BYTES = 16


class CommitmentError(ValueError):
    """A RunTrace's record commitment is malformed; the message names the field."""


def _uuid_bytes(record_id: str) -> bytes | None:
    """The 16 bytes of a canonical (lower-case, hyphenated) UUID string; None for anything else."""
    try:
        value = uuid.UUID(record_id)
    except ValueError:
        return None
    return value.bytes if str(value) == record_id else None


def encode(records: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """The commitment to these (record_id, kind) pairs: a count, and the ids grouped by kind."""
    by_kind: dict[str, list[bytes]] = {}
    other: dict[str, list[str]] = {}
    seen: set[str] = set()
    for record_id, kind in records:
        if record_id in seen:
            continue
        seen.add(record_id)
        raw = _uuid_bytes(record_id)
        if raw is None:
            other.setdefault(kind, []).append(record_id)
        else:
            by_kind.setdefault(kind, []).append(raw)
    doc: dict[str, Any] = {
        "count": len(seen),
        "ids": {k: base64.b64encode(b"".join(sorted(v))).decode("ascii") for k, v in sorted(by_kind.items())},
    }
    if other:
        doc["other"] = {k: sorted(v) for k, v in sorted(other.items())}
    return doc


def decode(doc: Any) -> dict[str, str]:
    """record_id -> kind of every record a commitment names; CommitmentError when it is malformed or its
    count does not match the ids it lists."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("ids"), Mapping):
        raise CommitmentError("the RunTrace's records commitment must be an object with ids by kind")
    named: dict[str, str] = {}
    for kind, packed in doc["ids"].items():
        try:
            raw = base64.b64decode(packed, validate=True) if isinstance(packed, str) else None
        except binascii.Error:
            raw = None
        if raw is None or len(raw) % _ID_BYTES:
            raise CommitmentError(f"records.ids[{kind!r}] is not base64 of 16-byte record ids")
        text = raw.hex()
        for i in range(0, len(text), 2 * _ID_BYTES):  # str(uuid.UUID(bytes=…)), without building the object
            h = text[i : i + 2 * _ID_BYTES]
            named[f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"] = str(kind)
    other = doc.get("other", {})
    if not isinstance(other, Mapping) or any(not isinstance(v, list) for v in other.values()):
        raise CommitmentError("records.other must map kinds to lists of record ids")
    for kind, ids in other.items():
        named.update((str(i), str(kind)) for i in ids)
    count = doc.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count != len(named):
        raise CommitmentError(f"records.count is {count!r} but the commitment lists {len(named)} record ids")
    return named
