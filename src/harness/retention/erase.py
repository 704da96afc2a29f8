"""`harness erase --user U`: honour an erasure request in the database and in the archive.

In the database (through the erasure port, harness.ports.retention.ErasureRows; its SQL adapter
harness.adapters.sql.erasure lists the fields): the person's final Runs have
their records' payloads replaced by a salted hash and their rows pseudonymised, their memory entries
are deleted. In the archive: every segment holding one of their Runs is rewritten with the same
redactions — each redacted record keeps its seq, ids, link and chain hash and carries its original
Merkle leaf hash, so the segment still verifies against the same signed checkpoint — stored under a new
name, checked, and the old segment is deleted. The erasure is audited (`user_erased`, naming the
pseudonym, never the person). Runs still running are left alone and listed: erase again once they close.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.audit import merkle
from harness.audit.segment import decode, encode
from harness.domain.chain import canonical_json, record_bytes
from harness.domain.ids import ordered_id
from harness.domain.retention import hashes_in, pseudonym, redacted_payload, swap_ids
from harness.ports.retention import ErasureRows
from harness.ports.segments import SegmentLocator, SegmentStore, SegmentStoreError
from harness.retention.archiver import ArchiveError
from harness.retention.storage import store_of

ACTOR = "erasure"
_ROW_COLUMNS = {"transitions": ("actor",), "audit_events": ("actor",), "costs": ("user_id",),
                "hitl_requests": ("requester",), "hitl_decisions": ("approver",)}


@dataclass
class EraseReport:
    """What an erasure did."""

    erase_id: str
    subject: str
    runs: int = 0
    records: int = 0
    memory_entries: int = 0
    archived_runs: int = 0
    #: stored contents (context snapshots, step inputs and outputs, LLM exchanges) deleted
    blobs: int = 0
    #: files sandboxed skills kept in a file store (HARNESS_ARTIFACT_STORE) deleted from it
    files: int = 0
    segments_rewritten: list[str] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)
    #: how the freed space was overwritten or given back (SQLite: VACUUM, the WAL truncated)
    space: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document."""
        return asdict(self)


def _redact_line(line: dict[str, Any], salt: bytes, erase_id: str, user_id: str, subject: str,
                 contents: set[str]) -> dict[str, Any]:
    for rec in line["records"]:
        data = record_bytes(rec["seq"], rec["record_id"], rec["run_id"], rec["kind"], rec["prev_hash"], rec["payload"])
        if hashlib.sha256(data).hexdigest() != rec["hash"]:
            raise ArchiveError(f"record seq {rec['seq']} of run {line['run_id']} in its segment no longer matches its "
                               "hash: nothing was erased from that segment")
        contents.update(hashes_in(rec["payload"]))
        rec["redacted"] = {"erase_id": erase_id, "leaf": merkle.leaf_hash(data).hex()}
        rec["payload"] = redacted_payload(salt, erase_id, rec["payload"])
    stub = canonical_json({"erased": erase_id})
    line["run"].update(user_id=subject, session_id=subject, idempotency_key=None, request=stub, context=None,
                       result=None, request_hash=None)
    tables = line["tables"]
    tables.pop("webhook_deliveries", None)
    for name, columns in _ROW_COLUMNS.items():
        for row in tables.get(name, []):
            for column in columns:
                row[column] = subject if row.get(column) == user_id else row.get(column)
            if name == "audit_events" and isinstance(row.get("detail"), str):
                row["detail"] = canonical_json(swap_ids(json.loads(row["detail"]), user_id, subject))
    for row in tables.get("hitl_decisions", []):
        row["reason"] = ""  # what an approver wrote about the person's Run
    for row in tables.get("hitl_requests", []):
        row["actions"] = canonical_json([])  # the steps' arguments put to the approver
    return line


def redact_segment(data: bytes, run_ids: set[str], salt: bytes, erase_id: str, user_id: str,
                   subject: str, contents: set[str] | None = None) -> bytes:
    """The segment with the named Runs redacted; header, digest and proof unchanged. The SHA-256s the
    redacted records named (the blobs they referenced among them) are added to `contents`."""
    named = contents if contents is not None else set()
    lines = list(decode(data))
    out = [_redact_line(x, salt, erase_id, user_id, subject, named) if x.get("run_id") in run_ids else x
           for x in lines]
    return encode(out)


def _delete_file(store: SegmentStore, location: str) -> None:
    """Delete a kept file from its store; one already gone (an erasure that stopped half-way) is fine."""
    try:
        store.delete(location)
    except SegmentStoreError:
        try:
            store.get(location)
        except SegmentStoreError:
            return  # gone already
        raise


def erase_user(erasure: ErasureRows, tenant_id: str, user_id: str, *, salt: bytes | None = None,
               segments: SegmentStore | None = None, locate: SegmentLocator = store_of, vacuum: bool = True,
               vacuum_full: bool = False) -> EraseReport:
    """Erase a person's data from the database and the archive; returns what was done. Segments are
    rewritten in `segments` when given, else in the store `locate` names for each (harness.config wires
    one that knows S3 too). Then the freed space is overwritten or given back (ErasureRows.reclaim:
    `vacuum` False skips SQLite's VACUUM, `vacuum_full` runs PostgreSQL's VACUUM FULL or MariaDB's
    OPTIMIZE TABLE)."""
    salt = salt or os.urandom(16)
    erase_id, subject = ordered_id(), pseudonym(salt, tenant_id, user_id)
    report = EraseReport(erase_id, subject)
    final, running = erasure.runs_of(tenant_id, user_id)
    report.still_running = running
    live = erasure.erase_live(erase_id, salt, tenant_id, user_id, subject, final)
    report.runs, report.records, report.memory_entries = live.runs, live.records, live.memory_entries
    locations = erasure.segment_locations()
    contents, erased = set(live.contents), list(final)
    for segment_id, run_ids in erasure.archived_of(tenant_id, user_id).items():
        old = locations[segment_id]
        holder = segments or locate(old)
        erased += run_ids
        new = redact_segment(holder.get(old), set(run_ids), salt, erase_id, user_id, subject, contents)
        location = holder.put(f"segment-{segment_id}.erased-{erase_id}.jsonl.gz", new)
        if holder.get(location) != new:
            raise ArchiveError(f"segment {location} reads back different from what was written")
        erasure.archived_erased(run_ids, subject, segment_id, location)
        holder.delete(old)
        report.archived_runs += len(run_ids)
        report.segments_rewritten.append(location)
    # the files first: a store that fails stops the erasure while the contents naming them are still there
    # to find on the next try; each was written for one call of these Runs, so nobody else's goes
    files = erasure.file_locations(erased)
    for location in files:
        _delete_file(locate(location), location)
    report.files = len(files)
    report.blobs = erasure.erase_contents(erased, contents)
    erasure.note(erase_id, subject, {"runs": report.runs, "records": report.records,
                                     "memory_entries": report.memory_entries,
                                     "archived_runs": report.archived_runs, "blobs": report.blobs,
                                     "files": report.files}, ACTOR)
    report.space = erasure.reclaim(vacuum=vacuum, vacuum_full=vacuum_full)
    return report
