"""`harness audit verify`: walk the hash chain and name the first bad record (SPEC A3, A3b).

Three layers, each catching what the one before cannot:

1. the chain walk: seq contiguous from 1, each record's hash recomputed, each prev_hash equal to the
   hash before it, the last record equal to chain_head: any edit, deletion, insertion or reordering;
2. cross-checks against the tables people read: every Run has a trace, and every row that mirrors a
   record agrees with it field by field (the read port's mirror check), so deleting a whole Run's records, or editing
   a row instead of its record, is caught even when the chain around the hole was rebuilt;
3. signed checkpoints, local and witnessed: the Merkle root the database gives at each checkpoint's tree
   size must equal the signed root, which catches a whole-table rewrite with a recomputed chain and
   chain head, and names the first record that differs (audit.verify_checkpoints).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from harness.audit import merkle, verify_checkpoints
from harness.audit.witness import Witness
from harness.domain.audit import REDACTED, ChainReport, Problem, PrunedRecord
from harness.domain.chain import GENESIS_HASH, record_bytes, record_hash
from harness.domain.records import StoredTraceRecord
from harness.ports.audit import AuditReads

__all__ = ["verify_chain"]

#: how far from its current seq a moved record's original seq is searched, to tell "reordered" from "edited"
_MOVE_WINDOW = 64


class _Walk:
    """The chain walk's state: where the next record must stand and what it must link to."""

    def __init__(self, store: AuditReads, report: ChainReport, sources: verify_checkpoints.Sources) -> None:
        self.store, self.report = store, report
        self.expected, self.prev = 1, GENESIS_HASH
        self.prev_id: str | None = None
        self.prev_ok = True
        self.acc = merkle.RootAccumulator()
        self.sources = sources
        self.sizes = sources.sizes()
        self.watch = any(s.segments for s in sources.ours)
        self.roots: dict[int, tuple[str, str]] = {0: (merkle.EMPTY_ROOT.hex(), GENESIS_HASH)}

    def step(self, rec: StoredTraceRecord | PrunedRecord) -> None:
        if isinstance(rec, PrunedRecord):
            self._pruned(rec)
            return
        # the canonical bytes are both the chain hash's input and the Merkle leaf: encode them once
        data = record_bytes(rec.seq, rec.record_id, rec.run_id, rec.kind, rec.prev_hash, rec.payload)
        problem = self._check(rec, hashlib.sha256(data).hexdigest() == rec.hash)
        if problem:
            self.report.add(problem)
        leaf = merkle.leaf_hash(data)
        if self.watch:
            self.sources.see(self.acc.size, leaf, rec)
        self.acc.append(leaf)
        if self.acc.size in self.sizes:
            self.roots[self.acc.size] = (self.acc.root().hex(), rec.hash)
        # resynchronise on this record so one fault is reported once, not for every record after it
        self.expected, self.prev, self.prev_id = rec.seq + 1, rec.hash, rec.record_id
        self.prev_ok = problem is None
        self.report.records_checked += 1

    def _pruned(self, rec: PrunedRecord) -> None:
        """A pruned record: only its place is checked here; its hash is what the next record must link to,
        and its leaf hash is part of every signed tree head after it (the checkpoints check that)."""
        if rec.seq != self.expected:
            self.report.add(Problem("deleted" if rec.seq > self.expected else "inserted", self.expected, None,
                                    f"the pruned record at seq {rec.seq} stands where seq {self.expected} should"))
        if self.watch:
            self.sources.see(self.acc.size, rec.leaf, rec)  # type: ignore[arg-type]
        self.acc.append(rec.leaf)
        if self.acc.size in self.sizes:
            self.roots[self.acc.size] = (self.acc.root().hex(), rec.hash)
        self.expected, self.prev, self.prev_id, self.prev_ok = rec.seq + 1, rec.hash, None, True
        self.report.records_checked += 1
        if rec.kind == REDACTED:
            self.report.records_redacted += 1
        else:
            self.report.records_pruned += 1

    def _check(self, rec: StoredTraceRecord, self_ok: bool) -> Problem | None:
        if rec.seq < self.expected:
            return Problem("inserted", rec.seq, rec.record_id, f"out of sequence, expected {self.expected}")
        if rec.seq > self.expected:
            return Problem("deleted", self.expected, None, f"records {self.expected}..{rec.seq - 1} missing")
        if self_ok and rec.prev_hash == self.prev:
            return None
        if len(self.report.problems) >= self.report.limit:
            # past the listing limit the problem is only counted: skip the lookups that explain it
            return Problem("edited", rec.seq, rec.record_id, "broken link")
        return self._explain(rec, self_ok)

    def _explain(self, rec: StoredTraceRecord, self_ok: bool) -> Problem:
        """Name what happened at a broken link, from where the record was originally chained."""
        origin = self._seq_of(rec.prev_hash)
        was = rec.seq if self_ok else self._original_seq(rec, origin)
        here, before = rec.seq, rec.seq - 1
        if was is None:
            return Problem("edited", here, rec.record_id, "the record's content no longer matches its hash")
        if was == here:
            return self._misdirected(rec, origin)
        if was == before and origin == here - 2 and self.prev_ok:
            return Problem("inserted", before, self.prev_id,
                           f"record {before} was inserted: record {here} was chained right after {origin}")
        if was == here + 1 and origin is None:
            return Problem("deleted", here, None,
                           f"the record before {rec.record_id} was deleted and later records renumbered")
        return Problem("reordered", here, rec.record_id, f"the record was chained at seq {was}, now {here}")

    def _misdirected(self, rec: StoredTraceRecord, origin: int | None) -> Problem:
        """An intact record whose prev_hash is not its predecessor's hash."""
        here, before = rec.seq, rec.seq - 1
        if origin is not None:
            return Problem("reordered", here, rec.record_id, f"links to seq {origin}, not to seq {before}")
        successor = self.store.seq_with_prev_hash(self.prev) if here > 1 else None
        if here == 1 or successor is None:
            # nothing links to the predecessor's hash any more: the predecessor is what changed
            name = (before, self.prev_id) if here > 1 else (here, rec.record_id)
            return Problem("edited", *name, f"record {name[0]} was rewritten: the link after it is broken")
        return Problem("inserted", here, rec.record_id,
                       f"does not link to record {before}, whose successor stands at seq {successor}")

    def _original_seq(self, rec: StoredTraceRecord, origin: int | None) -> int | None:
        """The seq this record's stored hash was computed with, if it is near; None if none fits."""
        candidates = [origin + 1] if origin is not None else []
        for d in range(1, _MOVE_WINDOW + 1):
            candidates += [rec.seq + d, rec.seq - d]
        rest = (rec.record_id, rec.run_id, rec.kind, rec.prev_hash, rec.payload)
        return next((seq for seq in candidates if seq > 0 and record_hash(seq, *rest) == rec.hash), None)

    def _seq_of(self, digest: str) -> int | None:
        """The seq of the record whose hash is `digest` (0 for the genesis hash)."""
        # neither hash column is indexed: a scan, done only to explain a broken link that is listed
        return 0 if digest == GENESIS_HASH else self.store.seq_with_hash(digest)


def _check_head(walk: _Walk, before: tuple[int, str], after: tuple[int, str]) -> None:
    """The last record must be the chain head (read before and after the walk, for live databases)."""
    last_seq, last_hash = walk.expected - 1, walk.prev
    report = walk.report
    if last_seq < before[0]:
        report.add(Problem("deleted", last_seq + 1, None,
                           f"records {last_seq + 1}..{before[0]} missing: the chain head says {before[0]}"))
    elif last_seq > after[0]:
        report.add(Problem("inserted", after[0] + 1, None,
                           f"records {after[0] + 1}..{last_seq} lie beyond the chain head {after[0]}"))
    elif (last_seq, last_hash) not in (before, after):
        report.add(Problem("head_mismatch", last_seq, walk.prev_id,
                           "the last record's hash differs from the chain head (rewritten, or head altered)"))


def _transition_counts(store: AuditReads, report: ChainReport) -> None:
    """A Run with transition rows but no "transition" record at all, chained or still in the outbox, lost
    its trace (a Run that lost only some is named row by row, by the mirror check)."""
    for run_id, n in store.runs_with_untraced_transitions():
        report.add(Problem("run_trace_missing", None, None, f"{n} transitions but no transition record",
                           run_id=run_id))


def _runs_without_trace(store: AuditReads, report: ChainReport) -> None:
    """A Run with no record at all, in the chain or the outbox, lost its whole trace."""
    for run_id in store.runs_without_trace():
        report.add(Problem("run_trace_missing", None, None, "the Run has no trace record", run_id=run_id))


def verify_chain(store: AuditReads, checkpoint_dir: Path | None = None, *, limit: int = 20,
                 witnesses: Sequence[Witness] = (), legacy_dir: Path | None = None,
                 require_checkpoint: bool = False) -> ChainReport:
    """Walk the whole chain and cross-check it with the rows that mirror it and with the checkpoints of
    `checkpoint_dir` and of the witnesses; list at most `limit` problems (all are counted). `legacy_dir`
    is the shared checkpoint folder of earlier versions, only reported on. With `require_checkpoint`,
    having no checkpoint of the database to check against is a problem (checkpoint_missing)."""
    report = ChainReport(limit=limit, database_id=store.known_database_id())
    if report.database_id is None:
        report.warnings.append("the database has no id (its schema predates revision 0013): checkpoints that name "
                               "a database cannot be told apart; open it with harness to migrate it")
    sources = verify_checkpoints.gather(report.database_id or "", checkpoint_dir, witnesses, legacy_dir, report)
    before = store.chain_head()
    walk = _Walk(store, report, sources)
    for rec in store.iter_chain():
        walk.step(rec)
    after = store.chain_head()
    report.chain_head = {"seq": after[0], "hash": after[1]}
    _check_head(walk, before, after)
    _transition_counts(store, report)
    _runs_without_trace(store, report)
    store.check_mirrors(report)
    verify_checkpoints.check(sources, walk.roots, walk.acc.size, report.database_id or "", checkpoint_dir, report,
                             required=require_checkpoint)
    report.outbox_backlog = store.outbox_backlog()
    return report
