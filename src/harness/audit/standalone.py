"""The standalone verifier (SPEC A3b): checks exports and checkpoints with no database access.

It imports only the standard library, `cryptography`, harness.audit.merkle and harness.domain.chain, so
an auditor can run it with a copy of the export, the checkpoints and the public key, and nothing else.
It is also the authority on the two document formats (the checkpoint publisher imports them from here):

- checkpoint (``harness-checkpoint/1``): a signed tree head ``{tree_size, root_hash, timestamp,
  chain_head_hash, key_id}`` with an Ed25519 signature over ``signed_message(head)``, plus an unsigned
  ``previous`` block carrying the consistency proof from the checkpoint published before it, and, on
  the first checkpoint a new signing key signs, an ``endorsement``: the retiring key's signature over
  the new key and this tree head (``endorsement_message``), so trust passes from the first key to the
  next without anyone fetching a key out of band again (key rotation);
- export (``harness-export/1``): a Run's records with their inclusion proofs against one checkpoint.

Console script ``harness-verify``: exit 0 valid, 1 invalid, 2 bad input.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import itertools
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from harness.audit import completeness, merkle
from harness.domain.chain import canonical_json, record_bytes, record_hash

CHECKPOINT_FORMAT = "harness-checkpoint/1"
#: version 2 also signs the database id and the leaf digests of the records it adds (LEAF_PREFIX_BYTES each)
CHECKPOINT_FORMAT_V2 = "harness-checkpoint/2"
ENDORSEMENT_FORMAT = "harness-key-endorsement/1"
EXPORT_FORMAT = "harness-export/1"
PUBLIC_KEY_FILE = "public-key.pem"
HEAD_FIELDS = ("tree_size", "root_hash", "timestamp", "chain_head_hash", "key_id")
HEAD_FIELDS_V2 = (*HEAD_FIELDS, "database_id", "leaves")
_HEAD_FIELDS = {CHECKPOINT_FORMAT: HEAD_FIELDS, CHECKPOINT_FORMAT_V2: HEAD_FIELDS_V2}
LEAF_PREFIX_BYTES = 8
RECORD_FIELDS = ("seq", "record_id", "run_id", "kind", "prev_hash", "payload", "hash")


class FormatError(ValueError):
    """A checkpoint, export, proof or key document is malformed; the message names the field."""


# ---------------------------------------------------------------------- documents


def _hex32(value: Any, what: str) -> bytes:
    if not isinstance(value, str) or len(value) != 2 * merkle.HASH_SIZE:
        raise FormatError(f"{what} must be a {2 * merkle.HASH_SIZE}-character hex string")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise FormatError(f"{what} is not hexadecimal") from None


def _count(value: Any, what: str) -> int:
    # bool is an int subclass; a tree size of `true` is a malformed document, not 1
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FormatError(f"{what} must be a non-negative integer")
    return value


def hex_proof(value: Any, what: str) -> list[bytes]:
    """A proof given as a list of hex hashes, decoded."""
    if not isinstance(value, list):
        raise FormatError(f"{what} must be a list of hex hashes")
    return [_hex32(p, f"{what}[{i}]") for i, p in enumerate(value)]


def check_checkpoint(doc: Any) -> dict[str, Any]:
    """Validate a checkpoint document's shape (not its signature); returns it."""
    if not isinstance(doc, dict):
        raise FormatError("a checkpoint must be a JSON object")
    fields = _HEAD_FIELDS.get(doc.get("format"))  # type: ignore[arg-type]
    if fields is None:
        raise FormatError(f"checkpoint format must be {CHECKPOINT_FORMAT_V2!r} or {CHECKPOINT_FORMAT!r}, "
                          f"not {doc.get('format')!r}")
    missing = [f for f in (*fields, "signature") if f not in doc]
    if missing:
        raise FormatError(f"checkpoint lacks {', '.join(missing)}")
    if doc["format"] == CHECKPOINT_FORMAT_V2:
        if not isinstance(doc["database_id"], str) or not doc["database_id"]:
            raise FormatError("database_id must be a non-empty string")
        leaf_prefixes(doc)
    _count(doc["tree_size"], "tree_size")
    _hex32(doc["root_hash"], "root_hash")
    _hex32(doc["chain_head_hash"], "chain_head_hash")
    if not isinstance(doc["timestamp"], int | float) or isinstance(doc["timestamp"], bool):
        raise FormatError("timestamp must be a number")
    if not isinstance(doc["key_id"], str) or not isinstance(doc["signature"], str):
        raise FormatError("key_id and signature must be strings")
    previous = doc.get("previous")
    if previous is not None:
        if not isinstance(previous, dict):
            raise FormatError("previous must be an object or null")
        _count(previous.get("tree_size"), "previous.tree_size")
        _hex32(previous.get("root_hash"), "previous.root_hash")
        hex_proof(previous.get("consistency_proof"), "previous.consistency_proof")
    endorsement = doc.get("endorsement")
    if endorsement is not None and (not isinstance(endorsement, dict) or any(
            not isinstance(endorsement.get(f), str) for f in ("public_key", "by_key_id", "signature"))):
        raise FormatError("endorsement must be an object of strings public_key, by_key_id and signature")
    return doc


def signed_message(head: dict[str, Any]) -> bytes:
    """The exact bytes a checkpoint's signature covers: the format tag and the canonical tree head."""
    tag = str(head.get("format", CHECKPOINT_FORMAT))
    fields = {name: head[name] for name in _HEAD_FIELDS.get(tag, HEAD_FIELDS)}
    return (tag + "\n" + canonical_json(fields)).encode("utf-8")


def database_of(checkpoint: dict[str, Any]) -> str | None:
    """The database a checkpoint covers; None for a checkpoint of format 1 (it names none)."""
    value = checkpoint.get("database_id") if checkpoint.get("format") == CHECKPOINT_FORMAT_V2 else None
    return str(value) if value is not None else None


def leaf_prefixes(checkpoint: dict[str, Any]) -> tuple[int, bytes] | None:
    """(first leaf index, concatenated leaf-hash prefixes) of the records a checkpoint of format 2 adds
    over the one before it, when it signs them: enough to name the first record a rewritten history
    changed. None when it does not."""
    leaves = checkpoint.get("leaves")
    if leaves is None:
        return None
    if not isinstance(leaves, dict) or leaves.get("prefix_bytes") != LEAF_PREFIX_BYTES:
        raise FormatError(f"leaves must be null or an object with prefix_bytes {LEAF_PREFIX_BYTES}")
    start = _count(leaves.get("start"), "leaves.start")
    try:
        data = base64.b64decode(leaves.get("prefixes", ""), validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise FormatError("leaves.prefixes is not base64") from None
    if len(data) != (checkpoint["tree_size"] - start) * LEAF_PREFIX_BYTES:
        return None  # not what a publisher writes: its signature does not hold either, and says so
    return start, data


def endorsement_message(new_key_id: str, by_key_id: str, head: dict[str, Any]) -> bytes:
    """The exact bytes an endorsement's signature covers: the new key, the endorsing key and the tree
    head of the checkpoint it appears on (an endorsement cannot be carried over to another head)."""
    fields = {"new_key_id": new_key_id, "by_key_id": by_key_id, "tree_size": head["tree_size"],
              "root_hash": head["root_hash"], "chain_head_hash": head["chain_head_hash"]}
    return (ENDORSEMENT_FORMAT + "\n" + canonical_json(fields)).encode("utf-8")


def raw_public_key(public_key: Ed25519PublicKey) -> str:
    """A public key as base64 of its raw 32 bytes (how an endorsement carries it)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def key_id_of(public_key: Ed25519PublicKey) -> str:
    """A stable name for a key: SHA-256 (hex) of its raw 32 public bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM."""
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise FormatError(f"not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise FormatError("the public key is not an Ed25519 key")
    return key


def signature_problem(checkpoint: dict[str, Any], public_key: Ed25519PublicKey) -> str | None:
    """Why the checkpoint's signature does not hold under `public_key`, or None when it does."""
    if checkpoint["key_id"] != key_id_of(public_key):
        return f"checkpoint was signed by key {checkpoint['key_id'][:16]}…, not by the given public key"
    try:
        signature = base64.b64decode(checkpoint["signature"], validate=True)
        public_key.verify(signature, signed_message(checkpoint))
    except (InvalidSignature, binascii.Error, ValueError):
        return "checkpoint signature is invalid (the tree head or the signature was altered)"
    return None


def key_for(checkpoint: dict[str, Any], trusted: Sequence[Ed25519PublicKey]) -> tuple[Ed25519PublicKey | None, str]:
    """(key, "") with the key that signed `checkpoint` when it is trusted: one of `trusted`, or a new key
    one of them endorsed on this very checkpoint; else (None, why not). The checkpoint's own signature
    is checked separately (signature_problem)."""
    by_id = {key_id_of(k): k for k in trusted}
    signer = checkpoint["key_id"]
    if signer in by_id:
        return by_id[signer], ""
    endorsement = checkpoint.get("endorsement")
    if endorsement is None:
        return None, (f"checkpoint was signed by key {signer[:16]}…, which is not a trusted key and no trusted "
                      "key endorsed: check the sequence from the checkpoint that introduced it, or pass its "
                      "public key (public-keys/<key id>.pem) obtained out of band")
    endorser = by_id.get(endorsement["by_key_id"])
    if endorser is None:
        return None, (f"checkpoint was signed by key {signer[:16]}…, endorsed by key "
                      f"{endorsement['by_key_id'][:16]}…, which is not a trusted key either")
    try:
        new_key = Ed25519PublicKey.from_public_bytes(base64.b64decode(endorsement["public_key"], validate=True))
    except (binascii.Error, ValueError):
        return None, "the endorsement's public_key is not a base64 Ed25519 public key"
    if key_id_of(new_key) != signer:
        return None, "the endorsed key is not the key that signed the checkpoint"
    try:
        endorser.verify(base64.b64decode(endorsement["signature"], validate=True),
                        endorsement_message(signer, endorsement["by_key_id"], checkpoint))
    except (InvalidSignature, binascii.Error, ValueError):
        return None, "the endorsement's signature is invalid (the endorsement or the tree head was altered)"
    return new_key, ""


def walk_keys(checkpoints: Sequence[dict[str, Any]], trusted: Sequence[Ed25519PublicKey]) -> list[
        tuple[Ed25519PublicKey | None, str]]:
    """For each checkpoint (oldest first), the key it was signed by — trusting `trusted` at the start,
    then only the key of the last good checkpoint or one it endorsed: a retired key signs nothing
    later — or None and why not (a key nobody trusted endorsed, a signature that does not hold)."""
    current: list[Ed25519PublicKey] = list(trusted)
    walked: list[tuple[Ed25519PublicKey | None, str]] = []
    for cp in checkpoints:
        key, problem = signed_by_trusted(cp, current)
        walked.append((key, problem))
        if key is not None:
            current = [key]
    return walked


def signed_by_trusted(checkpoint: dict[str, Any], trusted: Sequence[Ed25519PublicKey]) -> tuple[
        Ed25519PublicKey | None, str]:
    """(key, "") when the checkpoint is signed, validly, by a trusted key or one a trusted key endorsed
    on it; else (None, why not)."""
    key, problem = key_for(checkpoint, trusted)
    if key is not None:
        problem = signature_problem(checkpoint, key) or ""
    return (key, "") if key is not None and not problem else (None, problem)


def _trusted(public_key: Ed25519PublicKey | Sequence[Ed25519PublicKey]) -> list[Ed25519PublicKey]:
    return [public_key] if isinstance(public_key, Ed25519PublicKey) else list(public_key)


# ---------------------------------------------------------------------- results


@dataclass
class VerifyResult:
    """The outcome of a standalone check: `failures` first-to-last, empty when valid."""

    what: str
    checked: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: exports only: True when the export holds every record of its Run up to its close
    complete: bool | None = None

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document."""
        return {"ok": self.ok, **asdict(self)}


def _check_record(rec: Any, i: int, run_id: str, size: int, root: bytes) -> str | None:
    """Why exported record #i is not proven in the tree (size, root), or None."""
    if not isinstance(rec, dict) or any(f not in rec for f in RECORD_FIELDS):
        return f"record #{i} lacks one of {', '.join(RECORD_FIELDS)}"
    seq = _count(rec["seq"], f"records[{i}].seq")
    name = f"record seq {seq} ({rec['record_id']})"
    if rec["run_id"] != run_id:
        return f"{name} belongs to run {rec['run_id']!r}, not {run_id!r}"
    fields = (seq, rec["record_id"], rec["run_id"], rec["kind"], rec["prev_hash"], rec["payload"])
    if record_hash(*fields) != rec["hash"]:
        return f"{name}: content does not match its chain hash (edited)"
    if rec.get("leaf_index", seq - 1) != seq - 1:
        return f"{name}: leaf_index {rec.get('leaf_index')} is not seq - 1"
    if seq > size:
        return f"{name} is beyond the checkpoint's tree size {size}"
    proof = hex_proof(rec.get("inclusion_proof"), f"records[{i}].inclusion_proof")
    if not merkle.verify_inclusion(merkle.leaf_hash(record_bytes(*fields)), seq - 1, size, proof, root):
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
    if not isinstance(export, dict) or export.get("format") != EXPORT_FORMAT:
        raise FormatError(f"an export must be a JSON object with format {EXPORT_FORMAT!r}")
    _, problem = signed_by_trusted(checkpoint, _trusted(public_key))
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
    for i, rec in enumerate(records):
        record_problem = _check_record(rec, i, str(export.get("run_id")), size, root)
        if record_problem:
            result.failures.append(record_problem)
        result.checked += 1
    pending = export.get("not_covered") or []
    if result.ok:
        found = completeness.check(records, pending if isinstance(pending, list) else [])
        result.complete = found.complete
        result.failures.extend(found.missing)
        (result.notes if allow_incomplete else result.failures).extend(
            f"completeness unproven: {why}" for why in found.unproven)
        result.notes.extend(found.notes)
    if pending:
        result.notes.append(f"{len(pending)} record(s) of the Run are newer than the checkpoint, unverified")
    return result


def verify_consistency(
    old: Any, new: Any, public_key: Ed25519PublicKey | Sequence[Ed25519PublicKey],
    proof: Sequence[bytes] | None = None,
) -> VerifyResult:
    """Check that checkpoint `new` extends `old` append-only; the proof defaults to the one `new` embeds.
    Both must be signed by trusted keys (`new` may be signed by a key that `old`'s key endorsed on it)."""
    result = VerifyResult("consistency", checked=2)
    check_checkpoint(old)
    check_checkpoint(new)
    trusted = _trusted(public_key)
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
    walked = walk_keys(checkpoints, _trusted(public_key))
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
    exp.add_argument("--checkpoint", required=True)
    exp.add_argument("--allow-incomplete", action="store_true",
                     help="accept an export whose completeness cannot be proven (no RunTrace, or a Run recorded "
                          "by a version that did not commit to its records); it is still reported")
    cons = sub.add_parser("consistency", help="check that each checkpoint extends the one before it")
    cons.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT")
    seg = sub.add_parser("segment", help="check an archive segment (and a Run in it) against its checkpoint")
    seg.add_argument("segment")
    seg.add_argument("--checkpoint", help="the checkpoint the segment names (default: the copy it carries, "
                                          "still checked against the trusted public key)")
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
        export, checkpoint = _read_json(args.export, "export"), _read_json(args.checkpoint, "checkpoint")
        keys = _through_rotations(_public_keys(args.public_key, args.checkpoint, notes), args.checkpoint, notes)
        result = verify_export(export, checkpoint, keys, allow_incomplete=args.allow_incomplete)
    elif args.command == "segment":
        result = _run_segment(args, notes)
    else:
        if len(args.checkpoints) < 2:
            raise FormatError("give at least two checkpoints, oldest first")
        docs = [_read_json(p, "checkpoint") for p in args.checkpoints]
        keys = _public_keys(args.public_key, args.checkpoints[-1], notes)
        result = verify_sequence(docs, keys)
    result.notes[:0] = notes
    return result


def _run_segment(args: argparse.Namespace, notes: list[str]) -> VerifyResult:
    # segment imports this module: run as `python -m`, its FormatError is that module's, not __main__'s
    from harness.audit import standalone as canonical  # noqa: PLW0406
    from harness.audit.segment import verify_segment

    try:
        data = Path(args.segment).read_bytes()
    except OSError as exc:
        raise FormatError(f"cannot read segment file {args.segment}: {exc.strerror}") from None
    checkpoint = _read_json(args.checkpoint, "checkpoint") if args.checkpoint else None
    if args.checkpoint is None and not args.public_key:
        raise FormatError("give --public-key (the key you trust), or --checkpoint with public-key.pem beside it")
    keys = _public_keys(args.public_key, args.checkpoint or args.segment, notes)
    if args.checkpoint:
        keys = _through_rotations(keys, args.checkpoint, notes)
    try:
        return verify_segment(data, keys, checkpoint=checkpoint, run_id=args.run)
    except canonical.FormatError as exc:
        raise FormatError(str(exc)) from None


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
