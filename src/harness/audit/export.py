"""Export a Run's trace records with RFC 9162 inclusion proofs against a checkpoint (SPEC A3b).

The export carries every field needed to recompute each record's canonical bytes, so the standalone
verifier (harness.audit.standalone) checks it with the checkpoint and the public key alone. Records
chained after the checkpoint cannot be proven against it: they are listed under ``not_covered`` and
``complete`` is false. ``closed`` says whether the Run's RunTrace is among the proven records: it names
every record of the Run up to its close, which is how the verifier proves that none is withheld. A
record an erasure redacted carries its original leaf hash (``redacted``: erase id and leaf), as in an
archive segment: its place in the tree is still proven, its content no longer is.
The documented flow is ``harness audit checkpoint`` then ``harness audit export``.
"""

from __future__ import annotations

from typing import Any

from harness.audit.checkpoint import TamperedHistoryError, build_tree
from harness.audit.checkpoint_files import Checkpoint
from harness.audit.formats import EXPORT_FORMAT
from harness.domain.records import RUN_TRACE, StoredTraceRecord
from harness.ports.audit import ChainReads


def _record_doc(rec: StoredTraceRecord) -> dict[str, Any]:
    return {
        "seq": rec.seq,
        "record_id": rec.record_id,
        "run_id": rec.run_id,
        "kind": rec.kind,
        "prev_hash": rec.prev_hash,
        "payload": rec.payload,
        "hash": rec.hash,
    }


def export_run(store: ChainReads, run_id: str, checkpoint: Checkpoint) -> dict[str, Any]:
    """Every trace record of the Run, each with its inclusion proof in the checkpoint's tree.

    Raises UnknownRunError for an unknown Run, and TamperedHistoryError when the database no longer
    matches the checkpoint (the proofs would not verify, and the export would be misleading).
    """
    store.get_run(run_id)
    records = store.trace_of(run_id)
    size = checkpoint.tree_size
    tree = build_tree(store, size, checkpoint.chain_head_hash)
    if tree.root().hex() != checkpoint.root_hash:
        raise TamperedHistoryError(f"the first {size} records differ from {checkpoint.path.name}")
    covered, later = [], []
    redacted = store.redactions_of(run_id)
    for rec in records:
        doc = _record_doc(rec)
        if rec.seq in redacted:
            doc["redacted"] = redacted[rec.seq]
        if rec.seq > size:
            later.append(doc)
            continue
        proof = [p.hex() for p in tree.inclusion_proof(rec.seq - 1)]
        covered.append({**doc, "leaf_index": rec.seq - 1, "inclusion_proof": proof})
    pending = store.pending_of_run(run_id)
    return {
        "format": EXPORT_FORMAT,
        "run_id": run_id,
        "database_id": store.database_id(),
        "checkpoint": checkpoint.summary(),
        "records": covered,
        "not_covered": later,
        "pending_in_outbox": pending,
        "complete": not later and pending == 0,
        # the RunTrace names every record of the Run up to its close: without it (the Run has not closed)
        # the verifier cannot prove that none is withheld
        "closed": any(r["kind"] == RUN_TRACE for r in covered),
    }
