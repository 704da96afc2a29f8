"""`harness archive`: move final Runs older than the retention policy into a segment, then prune them.

One pass, in this order, so that a crash anywhere leaves the database whole (at worst a segment that
nothing refers to, or a segment noted but not yet pruned, which the next pass leaves alone):

1. drain the outbox and choose the Runs (final, past their tenant's cutoff, with their whole family);
2. chain the segment's manifest, an `archive_segment` audit event fixing its id, counts and digest;
3. publish a signed checkpoint that covers the manifest and every record of the chosen Runs;
4. write the segment (harness.audit.segment) and check it as an auditor would, with the checkpoint's
   public key and nothing else, before it is stored;
5. store it (write-once), read it back and compare, note it in `archive_segments`;
6. prune the Runs (through the archive port, harness.ports.retention.ArchiveRows), in transactions of
   500 Runs, each writing a `runs_pruned` audit event, deleting only records that are, field for field,
   the ones the verified segment holds. The database keeps each pruned record's chain and leaf hashes.
"""

from __future__ import annotations

import gzip
import io
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.audit import merkle, multiproof
from harness.audit.checkpoint import TamperedHistoryError, publish_checkpoint
from harness.audit.checkpoint_files import Checkpoint, current_key
from harness.audit.segment import SEGMENT_FORMAT, Digest, verify_segment
from harness.audit.witness import Witness
from harness.domain.errors import HarnessError
from harness.domain.ids import ordered_id
from harness.domain.records import StoredTraceRecord
from harness.domain.retention import ARCHIVE_SEGMENT
from harness.ports.retention import ArchiveRows
from harness.ports.segments import SegmentStore
from harness.ports.signer import Signer
from harness.retention.policy import RetentionPolicy

ACTOR = "archiver"


class ArchiveError(HarnessError):
    """An archive pass stopped before pruning anything (the segment did not verify, or was not stored)."""


@dataclass
class ArchiveReport:
    """What one archive pass did."""

    segment_id: str | None = None
    location: str | None = None
    runs: int = 0
    records: int = 0
    bytes: int = 0
    checkpoint: str | None = None
    tree_size: int = 0
    pruned_runs: int = 0
    pruned_records: int = 0
    kept: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document."""
        return asdict(self)


def _record_doc(rec: StoredTraceRecord, redacted: dict[str, str] | None = None) -> dict[str, Any]:
    doc = {"seq": rec.seq, "record_id": rec.record_id, "run_id": rec.run_id, "kind": rec.kind,
           "prev_hash": rec.prev_hash, "payload": rec.payload, "hash": rec.hash}
    if redacted is not None:  # erased while live: its payload is the salted hash, its leaf the original one
        doc["redacted"] = redacted
    return doc


def _line(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=str) + "\n").encode("utf-8")


class Archiver:
    """Archive passes over one database, into one segment store, proven by one checkpoint directory."""

    def __init__(self, retention: ArchiveRows, segments: SegmentStore, checkpoint_dir: Path, *,
                 policy: RetentionPolicy | None = None, witnesses: Sequence[Witness] = (),
                 signer: Signer | None = None) -> None:
        self.retention, self.segments, self.checkpoint_dir = retention, segments, checkpoint_dir
        #: who signs the pass's checkpoint (a signer process); None: this process's key file
        self.signer = signer
        self.chain = retention.chain
        self.policy = policy or RetentionPolicy.from_env()
        self.witnesses = witnesses

    def choose(self, limit: int | None = None) -> list[str]:
        """The Runs the policy lets go now, oldest first (at most one segment's worth)."""
        self.chain.drain_all()
        default, tenants = self.policy.cutoffs(self.chain.clock.now())
        ids = self.retention.eligible_runs(default, tenants, limit or self.policy.batch)
        pending = self.retention.pending_of(ids) if ids else set()
        return [r for r in ids if r not in pending]

    def run(self, *, limit: int | None = None, prune: bool = True, run_ids: Sequence[str] | None = None
            ) -> ArchiveReport:
        """One pass; an empty report when no Run is due."""
        started = time.perf_counter()
        ids = list(run_ids) if run_ids is not None else self.choose(limit)
        report = ArchiveReport()
        if not ids:
            return report
        bundle = self.retention.bundle(ids)
        ids = [r for r in ids if "run" in bundle[r]]
        digest = Digest()
        for run_id in ids:
            digest.add(run_id, [rec.hash for rec in bundle[run_id]["records"]])
        segment_id = ordered_id()
        name = f"segment-{segment_id}.jsonl.gz"
        head = self.chain.chain_head()[0]
        self.retention.audit(ARCHIVE_SEGMENT, ACTOR, {
            "segment_id": segment_id, "runs": digest.runs, "records": digest.records, "digest": digest.hexdigest(),
            "name": name})
        trees: list[merkle.MerkleTree] = []
        cp = publish_checkpoint(self.chain, self.checkpoint_dir, witnesses=self.witnesses, trees=trees,
                                signer=self.signer)
        manifest = self.retention.manifest_record(head, segment_id)
        if manifest is None:
            raise ArchiveError(f"the manifest record of segment {segment_id} is not in the chain")
        data = self._encode(cp, trees[0], segment_id, digest, manifest, ids, bundle)
        self._check(data, cp)
        location = self.segments.put(name, data)
        if self.segments.get(location) != data:
            raise ArchiveError(f"segment {location} reads back different from what was written: nothing pruned")
        self.retention.add_segment(segment_id, location, digest.runs, digest.records, digest.hexdigest(),
                                   cp.tree_size, cp.path.name)
        report = ArchiveReport(segment_id, location, digest.runs, digest.records, len(data), cp.path.name,
                               cp.tree_size)
        if prune:
            archived = {run_id: bundle[run_id]["records"] for run_id in ids}
            pruned = self.retention.prune(segment_id, archived, cp.tree_size, trees[0].leaf, ACTOR)
            report.pruned_runs, report.pruned_records, report.kept = pruned.runs, pruned.records, pruned.kept
        report.seconds = time.perf_counter() - started
        return report

    def _encode(self, cp: Checkpoint, tree: merkle.MerkleTree, segment_id: str, digest: Digest,
                manifest: StoredTraceRecord, ids: list[str], bundle: dict[str, dict[str, Any]]) -> bytes:
        if tree.size != cp.tree_size or tree.root().hex() != cp.root_hash:
            raise TamperedHistoryError(f"the chain no longer matches {cp.path.name}")
        buffer = io.BytesIO()
        with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=6, mtime=0) as out:
            out.write(_line({
                "format": SEGMENT_FORMAT, "segment_id": segment_id, "database_id": self.chain.database_id(),
                "created_at": self.chain.clock.now(), "runs": digest.runs, "records": digest.records,
                "digest": digest.hexdigest(), "checkpoint_file": cp.path.name, "checkpoint": cp.doc,
                "manifest": _record_doc(manifest)}))
            indices = [manifest.seq - 1]
            for i, run_id in enumerate(ids):
                entry = bundle[run_id]
                records, redacted = entry["records"], entry["redacted"]
                indices += [rec.seq - 1 for rec in records]
                docs = [_record_doc(r, redacted.get(r.seq)) for r in records]
                out.write(_line({"index": i, "run_id": run_id, "run": entry["run"], "job": entry.get("job"),
                                 "tables": entry["tables"], "records": docs}))
            proof = multiproof.multiproof(tree, sorted(indices), cp.tree_size)
            out.write(_line({"end": True, "proof": [p.hex() for p in proof]}))
        return buffer.getvalue()

    def _check(self, data: bytes, cp: Checkpoint) -> None:
        key = current_key(self.checkpoint_dir)
        if key is None:
            raise ArchiveError(f"no checkpoint in {self.checkpoint_dir} to check the segment against")
        checked = verify_segment(data, [key], checkpoint=cp.doc)
        if not checked.ok:
            raise ArchiveError("the segment did not verify, nothing was stored or pruned: "
                               + "; ".join(checked.failures[:3]))

