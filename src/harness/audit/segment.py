"""Archive segments: the document format and its standalone check (no database).

A segment is one immutable gzip-compressed JSON Lines file:

1. the header: the segment's id, database id, counts, the digest of its contents, the signed checkpoint
   everything in it is proven against, and its manifest record — the `archive_segment` audit record,
   chained *before* that checkpoint was published, whose payload names the same id, counts and digest;
2. one line per Run: its index in the segment, its rows (for reading it back) and every trace record of
   it exactly as chained (seq, record_id, run_id, kind, prev_hash, payload, hash);
3. the trailer: one Merkle multiproof (harness.audit.multiproof) that takes every record of the segment
   and the manifest record to the checkpoint's signed root.

The rows of a Run line are not in the proof: they are checked against the Run's proven records
(harness.audit.row_check), as `harness audit verify` checks a live Run's rows.

The digest is SHA-256 over, for each Run in segment order, the canonical JSON `[run_id, [record hash,
...]]` and a newline. The manifest record fixes it in the chain, so an edited record fails its hash or
the root, and a Run removed, added, swapped or cut off (a truncated file) changes the digest or the
counts the manifest fixes. Each Run's RunTrace names all its records, so a Run missing records fails too.

Why gzip JSON Lines rather than Parquet: an auditor reads a segment with the standalone verifier and the
standard library (no pyarrow); records keep the exact text that was hashed (a columnar re-encoding would
have to round-trip every payload byte for byte); it streams line by line; and trace payloads are
repetitive JSON that gzip shrinks several-fold.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from harness.audit import completeness, merkle, multiproof, row_check
from harness.audit.formats import (
    RECORD_FIELDS,
    FormatError,
    VerifyResult,
    check_checkpoint,
    database_of,
    hex_proof,
    not_text,
    signed_by_trusted,
)
from harness.domain.audit import ChainReport
from harness.domain.chain import canonical_json, record_bytes

SEGMENT_FORMAT = "harness-archive-segment/1"
MANIFEST_EVENT = "archive_segment"


class Digest:
    """The running digest of a segment's contents (see the module docstring)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.runs = 0
        self.records = 0

    def add(self, run_id: str, hashes: Sequence[str]) -> None:
        """The next Run of the segment, with the chain hashes of its records in chain order."""
        self._h.update((canonical_json([run_id, list(hashes)]) + "\n").encode("utf-8"))
        self.runs += 1
        self.records += len(hashes)

    def hexdigest(self) -> str:
        """The digest so far."""
        return self._h.hexdigest()


def encode(lines: Iterable[dict[str, Any]]) -> bytes:
    """The segment file's bytes: one compact JSON document per line, gzip-compressed (mtime 0, so the same
    contents always give the same bytes)."""
    body = "".join(json.dumps(line, separators=(",", ":"), ensure_ascii=False, default=str) + "\n"
                   for line in lines)
    return gzip.compress(body.encode("utf-8"), compresslevel=6, mtime=0)


class TruncatedSegmentError(FormatError):
    """The segment file ends before its compressed stream does: a partial copy, or cut on purpose."""


def decode(data: bytes) -> Iterator[dict[str, Any]]:
    """The segment's documents; TruncatedSegmentError for a compressed stream cut short, FormatError for a
    file that is not gzip-compressed JSON lines."""
    try:
        text = gzip.decompress(data).decode("utf-8")
    except (EOFError, zlib.error) as exc:
        raise TruncatedSegmentError(f"the segment file is truncated ({exc})") from None
    except (gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise FormatError(f"not a gzip-compressed JSON Lines segment ({exc})") from None
    for n, line in enumerate(text.splitlines(), 1):
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FormatError(f"segment line {n} is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise FormatError(f"segment line {n} is not a JSON object")
        yield doc


def _leaf(rec: Any, where: str) -> tuple[int, bytes] | str:
    """(leaf index, leaf hash) of a record whose content matches its chain hash, else why not. A record
    an erasure redacted carries its original leaf hash: its place in the tree is still proven, its content
    no longer is."""
    if not isinstance(rec, dict) or any(f not in rec for f in RECORD_FIELDS):
        return f"{where}: a record lacks one of {', '.join(RECORD_FIELDS)}"
    seq = rec["seq"]
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return f"{where}: a record's seq is not a positive integer"
    redacted = rec.get("redacted")
    if redacted is not None:
        try:
            return seq - 1, hex_proof([redacted.get("leaf") if isinstance(redacted, dict) else None],
                                      f"{where}: record seq {seq} redacted.leaf")[0]
        except FormatError as exc:
            return str(exc)
    wrong = not_text(rec, run_id_may_be_none=True)
    if wrong:
        return f"{where}: record seq {seq}: {wrong} must be a string"
    data = record_bytes(seq, rec["record_id"], rec["run_id"], rec["kind"], rec["prev_hash"], rec["payload"])
    if hashlib.sha256(data).hexdigest() != rec["hash"]:
        return f"{where}: record seq {seq} ({rec['record_id']}): content does not match its chain hash (edited)"
    return seq - 1, merkle.leaf_hash(data)


def _manifest_problem(header: dict[str, Any]) -> str | None:
    """Why the header's manifest record is not the `archive_segment` record of this very segment."""
    manifest = header.get("manifest")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("payload"), str):
        return "the header lacks its manifest record"
    try:
        payload = json.loads(manifest["payload"])
    except json.JSONDecodeError:
        return "the manifest record's payload is not JSON"
    detail = payload.get("detail") if isinstance(payload, dict) else None
    if not isinstance(detail, dict) or payload.get("event") != MANIFEST_EVENT or manifest.get("run_id"):
        return f"the manifest record is not an {MANIFEST_EVENT} audit event"
    for name in ("segment_id", "runs", "records", "digest"):
        if detail.get(name) != header.get(name):
            return (f"the header's {name} ({header.get(name)!r}) differs from the chained manifest's "
                    f"({detail.get(name)!r})")
    return None


def _checkpoint_problem(header: dict[str, Any], cp: dict[str, Any], embedded: dict[str, Any],
                        trusted: Sequence[Ed25519PublicKey]) -> str | None:
    if (cp["tree_size"], cp["root_hash"]) != (embedded["tree_size"], embedded["root_hash"]):
        return (f"the segment was proven against tree size {embedded['tree_size']}, not against the given "
                f"checkpoint's {cp['tree_size']}")
    _, problem = signed_by_trusted(cp, list(trusted))
    if problem:
        return problem
    if database_of(cp) not in (None, header.get("database_id")):
        return f"the checkpoint covers database {database_of(cp)}, the segment comes from {header.get('database_id')}"
    return None


class _Runs:
    """The Run lines as they are read: leaves, digest, per-Run completeness."""

    def __init__(self, result: VerifyResult, run_id: str | None) -> None:
        self.result, self.run_id = result, run_id
        self.leaves: dict[int, bytes] = {}
        self.digest = Digest()
        self.found = run_id is None

    def add(self, i: int, line: dict[str, Any]) -> None:
        name, records = str(line.get("run_id")), line.get("records")
        failures = self.result.failures
        if line.get("index") != i:
            failures.append(f"line {i + 2} holds Run #{line.get('index')} ({name}) where Run #{i} should stand "
                            "(reordered or cut)")
        if not isinstance(records, list):
            failures.append(f"Run {name}: no records")
            return
        before = len(failures)
        for rec in records:
            leaf = _leaf(rec, f"Run {name}")
            if isinstance(leaf, str):
                failures.append(leaf)
            elif rec["run_id"] != name:
                failures.append(f"Run {name}: record seq {rec['seq']} belongs to Run {rec['run_id']}")
            elif leaf[0] in self.leaves:
                failures.append(f"Run {name}: record seq {rec['seq']} appears twice in the segment")
            else:
                self.leaves[leaf[0]] = leaf[1]
        erased = [r["redacted"] for r in records if isinstance(r, dict) and isinstance(r.get("redacted"), dict)]
        if erased:
            self.result.notes.append(f"Run {name}: {len(erased)} record(s) redacted on an erasure request "
                                     f"({erased[0].get('erase_id')}): their places are proven, their content "
                                     "no longer")
        else:
            found = completeness.check(records, [])
            failures += [f"Run {name}: {m}" for m in found.missing]
            self.result.notes += [f"Run {name}: completeness unproven: {u}" for u in found.unproven]
            if len(failures) == before:  # the records hold: the row copies must say what they say
                failures += _row_failures(name, line)
        self.digest.add(name, [str(r.get("hash")) for r in records if isinstance(r, dict)])
        self.result.checked += 1
        if name == self.run_id:
            self.found = True
            self.result.notes.append(f"Run {name} is at line {i + 2}: {len(records)} record(s)")


def _row_failures(name: str, line: dict[str, Any]) -> list[str]:
    """The Run's row copies (what a read-back shows) that differ from its records, which the segment
    proves; an erasure replaced a person's data in both, so a redacted Run's rows prove nothing."""
    report = ChainReport()
    row_check.check_archived_run(line, report)
    return [f"Run {name}: its rows differ from its proven records: {p.detail}" for p in report.problems]


def verify_segment(data: bytes, trusted: Sequence[Ed25519PublicKey], *, checkpoint: dict[str, Any] | None = None,
                   run_id: str | None = None) -> VerifyResult:
    """Check a segment with no database: the checkpoint's signature, every record's hash, one multiproof
    taking all of them and the manifest record to the signed root, each Run's completeness and its rows
    against its records, and the digest over the whole (an edit, a cut, a reordering). `checkpoint`, when
    given, must be the one the segment was proven against; `run_id` names a Run that must be in it."""
    result = VerifyResult("segment")
    try:
        docs = list(decode(data))
    except TruncatedSegmentError as exc:
        result.failures.append(str(exc))
        return result
    header = docs[0] if docs else {}
    if header.get("format") != SEGMENT_FORMAT:
        raise FormatError(f"a segment starts with a header line of format {SEGMENT_FORMAT!r}")
    embedded = check_checkpoint(header.get("checkpoint"))
    cp = check_checkpoint(checkpoint) if checkpoint is not None else embedded
    problem = _checkpoint_problem(header, cp, embedded, trusted) or _manifest_problem(header)
    if problem:
        result.failures.append(problem)
        return result
    runs = _Runs(result, run_id)
    trailer = docs[-1] if len(docs) > 1 and docs[-1].get("end") is True else None
    for i, line in enumerate(docs[1 : len(docs) - (trailer is not None)]):
        runs.add(i, line)
    manifest = _leaf(header["manifest"], "manifest")
    if isinstance(manifest, str):
        result.failures.append(manifest)
    else:
        runs.leaves.setdefault(*manifest)
    if trailer is None:
        result.failures.append("the segment has no trailer with its proof (truncated)")
    else:
        indices = sorted(runs.leaves)
        root = multiproof.root_from(indices, [runs.leaves[i] for i in indices], cp["tree_size"],
                                    hex_proof(trailer.get("proof"), "trailer.proof"))
        if root is None or root.hex() != cp["root_hash"]:
            result.failures.append("the segment's records do not lead to the checkpoint's signed root (a record "
                                   "edited with its hash recomputed, moved, added or removed)")
    if (runs.digest.runs, runs.digest.records) != (header["runs"], header["records"]):
        result.failures.append(f"the segment holds {runs.digest.runs} Run(s) and {runs.digest.records} record(s); "
                               f"its chained manifest says {header['runs']} and {header['records']} (truncated, "
                               "or Runs removed or added)")
    elif runs.digest.hexdigest() != header["digest"]:
        result.failures.append("the segment's contents do not match the digest its chained manifest fixes "
                               "(Runs reordered, swapped or edited)")
    if not runs.found:
        result.failures.append(f"Run {run_id} is not in this segment")
    return result
