"""`harness audit verify`'s third layer: the chain against signed checkpoints, local and witnessed (SPEC A3b).

The database's Merkle root at each checkpoint's size must be the signed root. Checkpoints come from
the database's checkpoint directory and from its witnesses (each trusted from its first key through
endorsements); those of another database are reported as such, never as tampering, and the shared
``./harness-checkpoints`` of earlier versions is looked at only to say whether its checkpoints are this
database's. When a rewrite is found, the leaf-hash prefixes the checkpoints sign name the first record
that differs. Having nothing to check against is said loudly; a witness named to check against that
cannot be read (a mistyped path, a server that does not answer) fails the check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from harness.audit.checkpoint_files import list_checkpoints, public_key
from harness.audit.formats import LEAF_PREFIX_BYTES, FormatError, leaf_prefixes, walk_keys
from harness.audit.keys import LEGACY_KEY_FILE, CheckpointError, default_key_path
from harness.audit.places import DEFAULT_DIR
from harness.audit.witness import Witness, verified_docs
from harness.domain.audit import ChainReport, Problem
from harness.domain.records import StoredTraceRecord


@dataclass
class Source:
    """One set of this database's checkpoints: a directory's or a witness's."""

    name: str
    docs: list[tuple[str, dict[str, Any]]]
    trusted: list[Ed25519PublicKey]
    #: leaf prefix segments (start, prefixes), and the first leaf index where the chain differs from them
    segments: list[tuple[int, bytes]] = field(default_factory=list)
    first_diff: tuple[int, StoredTraceRecord] | None = None


@dataclass
class Sources:
    """What verify checks the chain against, gathered before the walk (the walk computes roots at their
    sizes), and what it only reports on."""

    ours: list[Source] = field(default_factory=list)
    others: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    legacy: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    legacy_dir: Path = Path(DEFAULT_DIR)

    def sizes(self) -> set[int]:
        """Every tree size whose root the walk must compute."""
        docs = [d for s in self.ours for _, d in s.docs] + [d for v in self.others.values() for _, d in v]
        return {int(d["tree_size"]) for d in docs + [d for _, d in self.legacy]}

    def see(self, index: int, leaf: bytes, rec: StoredTraceRecord) -> None:
        """The walk's leaf at `index`: note, per source, the first that differs from a signed prefix."""
        prefix = leaf[:LEAF_PREFIX_BYTES]
        for source in self.ours:
            if source.first_diff is not None:
                continue
            for start, data in source.segments:
                offset = (index - start) * LEAF_PREFIX_BYTES
                if 0 <= offset < len(data) and data[offset : offset + LEAF_PREFIX_BYTES] != prefix:
                    source.first_diff = (index, rec)
                    break


def _segments(docs: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, bytes]]:
    found = []
    for _, doc in docs:
        try:
            prefixes = leaf_prefixes(doc)
        except FormatError:
            continue  # the shape was checked when the file was read; a bad one is reported there
        if prefixes is not None:
            found.append(prefixes)
    return found


def gather(database_id: str, directory: Path | None, witnesses: Sequence[Witness], legacy_dir: Path | None,
           report: ChainReport) -> Sources:
    """Read the checkpoints of the directory, the witnesses and the old shared layout."""
    sources = Sources()
    if directory is not None and directory.is_dir():
        try:
            local = list_checkpoints(directory)
            ours = [(cp.path.name, cp.doc) for cp in local if cp.database_id in (None, database_id)]
            for cp in local:
                if cp.database_id not in (None, database_id):
                    sources.others.setdefault(str(cp.database_id), []).append((cp.path.name, cp.doc))
            trusted = [public_key(directory)] if ours else []
        except CheckpointError as exc:
            report.add(Problem("checkpoint_invalid", None, None, str(exc)))
        else:
            if ours:
                sources.ours.append(Source(str(directory), ours, trusted, _segments(ours)))
    home = sources.ours[0] if sources.ours else None
    for witness in witnesses:
        try:
            docs = verified_docs(witness, database_id)
            pinned = witness.public_key(database_id)
        except (CheckpointError, FormatError, OSError) as exc:  # a WitnessError is a CheckpointError
            # the auditor named the witness to check against: not reading it is a failed check, not a note
            report.add(Problem("witness_unreadable", None, None, f"witness {witness.name} could not be read, so "
                                                                 f"nothing was checked against it: {exc}"))
            continue
        named = [(f"checkpoint #{i + 1} of witness {witness.name}", d) for i, d in enumerate(docs)]
        local_key = home.trusted if home is not None else []
        if home is not None:
            _report_lag(witness.name, docs, home, report)
        if named:
            sources.ours.append(Source(f"witness {witness.name}", named, [*local_key, *([pinned] if pinned else [])],
                                       _segments(named)))
    if legacy_dir is not None and legacy_dir.is_dir() and directory != legacy_dir:
        sources.legacy_dir = legacy_dir
        try:
            sources.legacy = [(cp.path.name, cp.doc) for cp in list_checkpoints(legacy_dir) if cp.database_id is None]
        except CheckpointError:
            sources.legacy = []
    return sources


def _report_lag(name: str, docs: list[dict[str, Any]], local: Source, report: ChainReport) -> None:
    """A witness that lacks checkpoints the local folder holds (it was unreachable when they were published,
    or is not the witness they were published to) is said: the records they add are checked against the
    local checkpoints only."""
    newest = max(int(d["tree_size"]) for _, d in local.docs)
    held = max((int(d["tree_size"]) for d in docs), default=None)
    if held is not None and held >= newest:
        return
    if held is None:
        said = (f"holds no checkpoint of this database, and {local.name} holds {len(local.docs)}: nothing was "
                "checked against the witness")
    else:
        said = (f"holds checkpoints up to {held} records, and {local.name} up to {newest}: records "
                f"{held + 1}..{newest} were checked against the local checkpoints only")
    report.warnings.append(f"witness {name} {said}; `harness audit checkpoint --witness {name}` offers the witness "
                           "every checkpoint it lacks")


def check(sources: Sources, roots: dict[int, tuple[str, str]], size: int, database_id: str,
          directory: Path | None, report: ChainReport, *, required: bool = False) -> None:
    """Compare the walk's roots with every source's signed ones, and say what could not be checked (with
    `required`, having no checkpoint at all is a problem, not a warning)."""
    for source in sources.ours:
        _check_source(source, roots, size, report)
    for other, docs in sources.others.items():
        matching = sum(1 for _, d in docs if roots.get(int(d["tree_size"]), ("",))[0] == d["root_hash"])
        same = (f"; {matching} of them match this chain's history: this database is a copy of that one, or its "
                "id was changed") if matching else ""
        report.warnings.append(f"{len(docs)} checkpoint(s) in {directory} are of database {other}, not of this "
                               f"database ({database_id}): not checked against it{same}")
    if sources.legacy:
        _report_legacy(sources.legacy, sources.legacy_dir, roots, database_id, report)
    if report.checkpoints_checked == 0:
        where = f" in {directory}" if directory is not None else ""
        if directory is not None and not directory.is_dir():
            where += " (no checkpoints yet: the folder does not exist; the first checkpoint creates it)"
        missing = (f"NO CHECKPOINT of this database to check against{where}: the chain was checked only against "
                   "itself, and a whole-table rewrite with a recomputed chain would go unnoticed; publish one with "
                   "`harness audit checkpoint` (and keep a copy elsewhere with --witness)")
        if required:
            report.add(Problem("checkpoint_missing", None, None, missing))
        else:
            report.warnings.append(missing)


def _check_source(source: Source, roots: dict[int, tuple[str, str]], size: int, report: ChainReport) -> None:
    walked = walk_keys([d for _, d in source.docs], source.trusted)
    good = 0
    for (label, doc), (key, problem) in zip(source.docs, walked, strict=True):
        report.checkpoints_checked += 1
        tree_size = int(doc["tree_size"])
        if key is None:
            report.add(Problem("checkpoint_invalid", None, None, f"{label}: {problem}"))
        elif tree_size > size:
            report.add(_beyond(source, label, size, tree_size))
        elif roots.get(tree_size) != (doc["root_hash"], doc["chain_head_hash"]):
            report.add(_mismatch(source, label, good, tree_size))
        else:
            good = max(good, tree_size)


def _beyond(source: Source, label: str, size: int, tree_size: int) -> Problem:
    """A signed tree bigger than the chain: records deleted (or the database rolled back), unless a record
    the chain holds differs from what was signed, and then the chain forked from the signed history."""
    found = source.first_diff
    if found is None or found[0] >= size:
        return Problem("deleted", size + 1, None, f"{label} covers {tree_size} records, the chain {size}: records "
                                                  f"{size + 1}..{tree_size} were deleted, or the database rolled back "
                                                  "to an older copy")
    index, rec = found
    return Problem("forked", rec.seq, rec.record_id,
                   f"the chain forked from the history {label} signs: record {index + 1} is the first that differs "
                   f"(here {rec.kind} record {rec.record_id} of run {rec.run_id}) and {label} covers {tree_size} "
                   f"records, the chain {size} (another copy of this database published it, or this one was "
                   "restored and went on)", rec.run_id)


def _mismatch(source: Source, label: str, good: int, tree_size: int) -> Problem:
    """A signed root the chain no longer gives, naming the first record that differs when the
    checkpoints sign the prefixes of the leaves (format 2)."""
    found = source.first_diff
    if found is None or found[0] >= tree_size:
        return Problem("checkpoint_mismatch", None, None,
                       f"records {good + 1}..{tree_size} differ from the signed {label}: history was rewritten "
                       "(the checkpoints sign no per-record digest for this range, so the record cannot be named)")
    index, rec = found
    return Problem("checkpoint_mismatch", rec.seq, rec.record_id,
                   f"history was rewritten: record {index + 1} is the first that differs from the signed {label} "
                   f"(now {rec.kind} record {rec.record_id} of run {rec.run_id}); records {index + 1}..{tree_size} "
                   "are not what was signed", rec.run_id)


def _report_legacy(legacy: list[tuple[str, dict[str, Any]]], root: Path, roots: dict[int, tuple[str, str]],
                   database_id: str, report: ChainReport) -> None:
    """Checkpoints of the shared folder of earlier versions name no database: say whether they are ours."""
    matching = sum(1 for _, d in legacy if roots.get(int(d["tree_size"])) == (d["root_hash"], d["chain_head_hash"]))
    target = root / database_id
    if matching == len(legacy):
        key = root / LEGACY_KEY_FILE
        moves = f"mkdir -p {target} && mv {root}/checkpoint-*.json {root}/public-key.pem {root}/public-keys {target}/"
        if key.exists():
            moves += f" && mv {key} {default_key_path(database_id)}"
        report.warnings.append(f"{len(legacy)} checkpoint(s) of an earlier version in {root} (the shared folder, "
                               f"naming no database) match this database: move them to its own folder: {moves}")
    else:
        report.warnings.append(f"{len(legacy)} checkpoint(s) of an earlier version in {root} name no database and "
                               f"{len(legacy) - matching} of them do not match this one (another database's, or "
                               "this one's before a rewrite): not checked against it")
