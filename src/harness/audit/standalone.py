"""The standalone verifier (SPEC A3b): checks exports, checkpoints and archive segments with no database.

It imports only the standard library, `cryptography` and the pure audit modules (formats, merkle,
completeness, segment, row_check) with the pure domain and kernel they use, so an auditor can run it
with a copy of the export, the checkpoints and the public key, and nothing else. The document formats
themselves are described in harness.audit.formats.

Console script ``harness-verify``: exit 0 valid, 1 invalid, 2 bad input.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from harness.audit import completeness, merkle
from harness.audit.formats import (
    EXPORT_FORMAT,
    PUBLIC_KEY_FILE,
    RECORD_FIELDS,
    FormatError,
    VerifyResult,
    check_checkpoint,
    count_field,
    database_of,
    hex_proof,
    key_id_of,
    load_public_key,
    not_text,
    signed_by_trusted,
    trusted_keys,
    walk_keys,
)
from harness.audit.segment import decode, verify_segment
from harness.domain.chain import record_bytes, record_hash


def _check_record(rec: Any, i: int, run_id: str, size: int, root: bytes) -> str | None:
    """Why exported record #i is not proven in the tree (size, root), or None."""
    if not isinstance(rec, dict) or any(f not in rec for f in RECORD_FIELDS):
        return f"record #{i} lacks one of {', '.join(RECORD_FIELDS)}"
    seq = count_field(rec["seq"], f"records[{i}].seq")
    wrong = not_text(rec, run_id_may_be_none=False)  # an exported record is its Run's
    if wrong:
        raise FormatError(f"records[{i}].{wrong} must be a string")
    name = f"record seq {seq} ({rec['record_id']})"
    if rec["run_id"] != run_id:
        return f"{name} belongs to run {rec['run_id']!r}, not {run_id!r}"
    fields = (seq, rec["record_id"], rec["run_id"], rec["kind"], rec["prev_hash"], rec["payload"])
    redacted = rec.get("redacted")
    if redacted is not None:  # an erasure replaced its content: its original leaf hash proves its place
        leaf = hex_proof([redacted.get("leaf") if isinstance(redacted, dict) else None],
                         f"records[{i}].redacted.leaf")[0]
    elif record_hash(*fields) != rec["hash"]:
        return f"{name}: content does not match its chain hash (edited)"
    else:
        leaf = merkle.leaf_hash(record_bytes(*fields))
    if rec.get("leaf_index", seq - 1) != seq - 1:
        return f"{name}: leaf_index {rec.get('leaf_index')} is not seq - 1"
    if seq > size:
        return f"{name} is beyond the checkpoint's tree size {size}"
    proof = hex_proof(rec.get("inclusion_proof"), f"records[{i}].inclusion_proof")
    if not merkle.verify_inclusion(leaf, seq - 1, size, proof, root):
        return f"{name}: inclusion proof does not lead to the checkpoint's root"
    return None


def verify_export(export: Any, checkpoint: Any, public_key: Ed25519PublicKey | Sequence[Ed25519PublicKey], *,
                  allow_incomplete: bool = False) -> VerifyResult:
    """Check every record of an export against a signed checkpoint (inclusion proofs, RFC 9162), and that
    the export holds every record of its Run (audit.completeness). The checkpoint must be signed by one of
    the trusted keys, or by a key one of them endorsed on it. An export whose completeness cannot be
    proven (no RunTrace, a RunTrace of an earlier version) fails unless `allow_incomplete`; a record the
    RunTrace names and the export lacks always fails."""
    result = VerifyResult("export")
    check_checkpoint(checkpoint)
    _check_export(export)
    _, problem = signed_by_trusted(checkpoint, trusted_keys(public_key))
    if problem:
        result.failures.append(problem)
        return result
    covers, source = database_of(checkpoint), export.get("database_id")
    if covers is not None and source is not None and covers != source:
        result.failures.append(f"the checkpoint covers database {covers}, the export comes from database "
                               f"{source}: check it against a checkpoint of its own database")
        return result
    size, root = checkpoint["tree_size"], bytes.fromhex(checkpoint["root_hash"])
    claimed = export.get("checkpoint")
    if not isinstance(claimed, dict):
        raise FormatError("export.checkpoint must name the checkpoint the proofs were made against")
    if (claimed.get("tree_size"), claimed.get("root_hash")) != (size, checkpoint["root_hash"]):
        result.failures.append(
            f"the export was made against tree size {claimed.get('tree_size')}, not this checkpoint's {size}"
        )
        return result
    records = export.get("records")
    if not isinstance(records, list):
        raise FormatError("export.records must be a list")
    pending = export.get("not_covered") or []
    if not isinstance(pending, list):
        raise FormatError("export.not_covered must be a list of the records newer than the checkpoint")
    for i, rec in enumerate(records):
        record_problem = _check_record(rec, i, str(export.get("run_id")), size, root)
        if record_problem:
            result.failures.append(record_problem)
        result.checked += 1
    erased = [r["redacted"] for r in records if isinstance(r, dict) and isinstance(r.get("redacted"), dict)]
    if result.ok and erased:
        # as in a segment: the RunTrace that names the Run's records was redacted with the rest
        result.notes.append(f"{len(erased)} record(s) redacted on an erasure request ({erased[0].get('erase_id')}): "
                            "their places are proven, their content and the Run's completeness no longer")
    elif result.ok:
        found = completeness.check(records, pending)
        result.complete = found.complete
        result.failures.extend(found.missing)
        (result.notes if allow_incomplete else result.failures).extend(
            f"completeness unproven: {why}" for why in found.unproven)
        result.notes.extend(found.notes)
    if pending:
        result.notes.append(f"{len(pending)} record(s) of the Run are newer than the checkpoint, unverified")
    return result


def _check_export(export: Any) -> None:
    if not isinstance(export, dict) or export.get("format") != EXPORT_FORMAT:
        raise FormatError(f"an export must be a JSON object with format {EXPORT_FORMAT!r}")


def verify_consistency(
    old: Any, new: Any, public_key: Ed25519PublicKey | Sequence[Ed25519PublicKey],
    proof: Sequence[bytes] | None = None,
) -> VerifyResult:
    """Check that checkpoint `new` extends `old` append-only; the proof defaults to the one `new` embeds.
    Both must be signed by trusted keys (`new` may be signed by a key that `old`'s key endorsed on it)."""
    result = VerifyResult("consistency", checked=2)
    check_checkpoint(old)
    check_checkpoint(new)
    trusted = trusted_keys(public_key)
    old_key, problem = signed_by_trusted(old, trusted)
    if problem:
        result.failures.append(f"old: {problem}")
    _, problem = signed_by_trusted(new, trusted + ([old_key] if old_key is not None else []))
    if problem:
        result.failures.append(f"new: {problem}")
    if result.failures:
        return result
    extension = _extension_problem(old, new, proof)
    if extension:
        result.failures.append(extension)
    return result


def _extension_problem(old: dict[str, Any], new: dict[str, Any], proof: Sequence[bytes] | None) -> str | None:
    """Why `new`'s tree is not an append-only extension of `old`'s, or None."""
    if old["tree_size"] > new["tree_size"]:
        return f"tree size shrank from {old['tree_size']} to {new['tree_size']}"
    if proof is None:
        previous = new.get("previous") or {}
        if (previous.get("tree_size"), previous.get("root_hash")) != (old["tree_size"], old["root_hash"]):
            return "new does not embed a proof from old: give every checkpoint in between"
        proof = hex_proof(previous["consistency_proof"], "previous.consistency_proof")
    roots = bytes.fromhex(old["root_hash"]), bytes.fromhex(new["root_hash"])
    if not merkle.verify_consistency(old["tree_size"], new["tree_size"], *roots, proof):
        return (f"consistency proof from tree size {old['tree_size']} to {new['tree_size']} does not hold: "
                "the history the old checkpoint signed was rewritten")
    return None


def verify_sequence(checkpoints: Sequence[Any], public_key: Ed25519PublicKey | Sequence[Ed25519PublicKey]
                    ) -> VerifyResult:
    """Check each checkpoint against the one before it, through the proofs they embed, and that each is
    signed by a trusted key: `public_key` at the start, then whichever key the one before it endorsed
    (a key rotation), never a retired one."""
    result = VerifyResult("consistency")
    for cp in checkpoints:
        check_checkpoint(cp)
    walked = walk_keys(checkpoints, trusted_keys(public_key))
    result.failures.extend(f"checkpoint #{i + 1} (tree size {cp['tree_size']}): {problem}"
                           for i, (cp, (_, problem)) in enumerate(zip(checkpoints, walked, strict=True)) if problem)
    keys = [key for key, _ in walked]
    for (old, new), (old_key, new_key) in zip(itertools.pairwise(checkpoints), itertools.pairwise(keys),
                                              strict=True):
        result.checked += 1
        if old_key is None or new_key is None:
            continue  # already reported
        problem = _extension_problem(old, new, None)
        if problem:
            result.failures.append(f"{old['tree_size']} -> {new['tree_size']}: {problem}")
        if new_key is not old_key and "endorsement" in new:
            result.notes.append(f"signing key rotated at tree size {new['tree_size']}: "
                                f"{key_id_of(old_key)[:16]}… endorsed {key_id_of(new_key)[:16]}…")
    return result


# ---------------------------------------------------------------------- command line


def _read_json(path: str, what: str = "file") -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormatError(f"{what} file {path} does not exist") from None
    except OSError as exc:
        raise FormatError(f"cannot read {what} file {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(f"{path} is not valid JSON: {exc}") from None


def _checkpoint_file(given: str, made_against: Any, database_id: Any, what: str) -> str:
    """The checkpoint file to check `what` against: `given` itself when it is a file; when it is a folder
    (a database's checkpoint folder, or the folder of such folders), the checkpoint in it that `what` was
    made against: the one with the tree size and root hash `made_against` names."""
    folder = Path(given)
    if not folder.is_dir():
        return given
    if not isinstance(made_against, dict) or "tree_size" not in made_against:
        raise FormatError(f"the {what} names no checkpoint to look for in {given}: pass the checkpoint file")
    homes = [folder] + ([folder / database_id] if isinstance(database_id, str) and database_id else [])
    for path in sorted(p for home in homes for p in home.glob("checkpoint-*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # not a checkpoint this one could be; the one named is checked in full below
        if isinstance(doc, dict) and (doc.get("tree_size"), doc.get("root_hash")) == (
                made_against["tree_size"], made_against.get("root_hash")):
            return str(path)
    raise FormatError(f"no checkpoint in {given} has tree size {made_against['tree_size']} and the root hash "
                      f"the {what} was made against: give the folder its database publishes checkpoints to")


def _public_keys(options: Sequence[str] | None, checkpoint_path: str, notes: list[str]) -> list[Ed25519PublicKey]:
    """The trusted keys: every --public-key, else the first key published beside the checkpoint."""
    paths = [Path(o) for o in options] if options else [Path(checkpoint_path).parent / PUBLIC_KEY_FILE]
    if not options:
        notes.append(f"public key read from {paths[0]}; pass --public-key with a key obtained out of band")
    keys = []
    for path in paths:
        try:
            keys.append(load_public_key(path.read_bytes()))
        except FileNotFoundError:
            hint = "" if options else " (the checkpoint's folder has no published public key: pass --public-key)"
            raise FormatError(f"public key {path} does not exist{hint}") from None
        except OSError as exc:
            raise FormatError(f"cannot read public key {path}: {exc.strerror}") from None
    return keys


def _through_rotations(trusted: list[Ed25519PublicKey], checkpoint_path: str,
                       notes: list[str]) -> list[Ed25519PublicKey]:
    """The trusted keys plus the key that signs at `checkpoint_path` when the checkpoints beside it, up to
    it, pass trust on to it through endorsements (the checkpoint directory's own history)."""
    target = Path(checkpoint_path)
    history = sorted(p for p in target.parent.glob("checkpoint-*.json") if p.name <= target.name)
    if len(history) < 2 or target.resolve() not in {p.resolve() for p in history}:
        return trusted
    try:
        docs = [check_checkpoint(_read_json(str(p))) for p in history]
    except FormatError:
        return trusted
    last = walk_keys(docs, trusted)[-1][0]
    if last is None or key_id_of(last) in {key_id_of(k) for k in trusted}:
        return trusted
    notes.append(f"{target.name} is signed by key {key_id_of(last)[:16]}…, trusted through the key "
                 f"rotation(s) recorded in the {len(history)} checkpoints up to it")
    return [*trusted, last]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness-verify", description="Check audit exports and checkpoints")
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="check an exported Run against a checkpoint")
    exp.add_argument("export")
    exp.add_argument("--checkpoint", required=True,
                     help="the checkpoint file, or its folder: then the checkpoint the export was made against")
    exp.add_argument("--allow-incomplete", action="store_true",
                     help="accept an export whose completeness cannot be proven (no RunTrace, or a Run recorded "
                          "by a version that did not commit to its records); it is still reported")
    cons = sub.add_parser("consistency", help="check that each checkpoint extends the one before it")
    cons.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT")
    seg = sub.add_parser("segment", help="check an archive segment (and a Run in it) against its checkpoint")
    seg.add_argument("segment")
    seg.add_argument("--checkpoint", help="the checkpoint the segment names, or its folder (default: the copy it "
                                          "carries, still checked against the trusted public key)")
    seg.add_argument("--run", help="a Run that must be in the segment")
    for p in (exp, cons, seg):
        p.add_argument("--public-key", action="append",
                       help="a trusted PEM public key, repeatable (default: public-key.pem beside the checkpoint, "
                            "the first key that signed there; later keys are trusted through its endorsements)")
        p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    return parser


def _run(args: argparse.Namespace) -> VerifyResult:
    notes: list[str] = []
    if args.command == "export":
        # the documents first: a missing file is named as such, not as a missing public key beside it
        export = _read_json(args.export, "export")
        _check_export(export)  # before it is asked which checkpoint it names
        if Path(args.checkpoint).is_dir():
            args.checkpoint = _checkpoint_file(args.checkpoint, export.get("checkpoint"), export.get("database_id"),
                                               "export")
            notes.append(f"checked against {args.checkpoint}, the checkpoint the export was made against")
        checkpoint = _read_json(args.checkpoint, "checkpoint")
        keys = _through_rotations(_public_keys(args.public_key, args.checkpoint, notes), args.checkpoint, notes)
        result = verify_export(export, checkpoint, keys, allow_incomplete=args.allow_incomplete)
    elif args.command == "segment":
        result = _run_segment(args, notes)
    else:
        if len(args.checkpoints) < 2:
            raise FormatError("give at least two checkpoints, oldest first")
        docs = [_read_json(p, "checkpoint") for p in args.checkpoints]
        for path, doc in zip(args.checkpoints, docs, strict=True):
            try:
                check_checkpoint(doc)
            except FormatError as exc:  # which of the files is malformed, not only which field
                raise FormatError(f"{path}: {exc}") from None
        keys = _public_keys(args.public_key, args.checkpoints[-1], notes)
        result = verify_sequence(docs, keys)
    result.notes[:0] = notes
    return result


def _run_segment(args: argparse.Namespace, notes: list[str]) -> VerifyResult:
    try:
        data = Path(args.segment).read_bytes()
    except OSError as exc:
        raise FormatError(f"cannot read segment file {args.segment}: {exc.strerror}") from None
    if args.checkpoint and Path(args.checkpoint).is_dir():
        header = _segment_header(data)
        made_against = header.get("checkpoint")
        database_id = made_against.get("database_id") if isinstance(made_against, dict) else None
        args.checkpoint = _checkpoint_file(args.checkpoint, made_against, database_id, "segment")
        notes.append(f"checked against {args.checkpoint}, the checkpoint the segment was proven against")
    checkpoint = _read_json(args.checkpoint, "checkpoint") if args.checkpoint else None
    if args.checkpoint is None and not args.public_key:
        raise FormatError("give --public-key (the key you trust), or --checkpoint with public-key.pem beside it")
    keys = _public_keys(args.public_key, args.checkpoint or args.segment, notes)
    if args.checkpoint:
        keys = _through_rotations(keys, args.checkpoint, notes)
    return verify_segment(data, keys, checkpoint=checkpoint, run_id=args.run)


def _segment_header(data: bytes) -> dict[str, Any]:
    """A segment's header line (the first), or {} when it cannot be read; verify_segment names why."""
    try:
        header = next(iter(decode(data)), {})
    except FormatError:
        return {}
    return header if isinstance(header, dict) else {}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `harness-verify`: 0 valid, 1 invalid, 2 bad input."""
    args = _parser().parse_args(argv)
    try:
        result = _run(args)
    except FormatError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    else:
        verdict = "INVALID" if not result.ok else "VALID" if result.complete is not False else \
            "VALID, COMPLETENESS UNPROVEN"
        sys.stdout.write(f"{result.what}: {verdict} ({result.checked} checked)\n")
        sys.stdout.writelines(f"  FAIL {f}\n" for f in result.failures)
        sys.stdout.writelines(f"  note {n}\n" for n in result.notes)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
