"""The audit document formats (SPEC A3b) and their checks, shared by everyone who reads or writes them.

The authority on the two documents: the checkpoint (``harness-checkpoint/1`` and ``/2``: a signed tree
head ``{tree_size, root_hash, timestamp, chain_head_hash, key_id}`` with an Ed25519 signature over
``signed_message(head)``, an unsigned ``previous`` block carrying the consistency proof from the checkpoint
before it, and, on the first checkpoint a new signing key signs, an ``endorsement``: the retiring key's
signature over the new key and this tree head, ``endorsement_message``) and the export
(``harness-export/1``). The checkpoint publisher, the witnesses, the archive segments and the standalone
verifier import them from here.

It imports only the standard library, `cryptography`, harness.audit.merkle and harness.domain.chain,
so the standalone verifier that imports it loads no database code.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from harness.audit import merkle
from harness.domain.chain import canonical_json

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


def count_field(value: Any, what: str) -> int:
    # bool is an int subclass; a tree size of `true` is a malformed document, not 1
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FormatError(f"{what} must be a non-negative integer")
    return value


def hex_proof(value: Any, what: str) -> list[bytes]:
    """A proof given as a list of hex hashes, decoded."""
    if not isinstance(value, list):
        raise FormatError(f"{what} must be a list of hex hashes")
    return [_hex32(p, f"{what}[{i}]") for i, p in enumerate(value)]


def not_text(rec: dict[str, Any], *, run_id_may_be_none: bool) -> str | None:
    """The first of a record's chained text fields (record_id, run_id, kind, prev_hash, payload) that is not a
    string, or None; a record of no Run (an audit record in a segment) has run_id None."""
    for name in ("record_id", "run_id", "kind", "prev_hash", "payload"):
        value = rec[name]
        if not isinstance(value, str) and not (name == "run_id" and value is None and run_id_may_be_none):
            return name
    return None


def check_checkpoint(doc: Any) -> dict[str, Any]:
    """Validate a checkpoint document's shape (not its signature), every field by type; returns it."""
    if not isinstance(doc, dict):
        raise FormatError("a checkpoint must be a JSON object")
    tag = doc.get("format")
    fields = _HEAD_FIELDS.get(tag) if isinstance(tag, str) else None
    if fields is None:
        raise FormatError(f"checkpoint format must be {CHECKPOINT_FORMAT_V2!r} or {CHECKPOINT_FORMAT!r}, "
                          f"not {tag!r}")
    missing = [f for f in (*fields, "signature") if f not in doc]
    if missing:
        raise FormatError(f"checkpoint lacks {', '.join(missing)}")
    # the tree size first: the leaf prefixes are checked against it
    count_field(doc["tree_size"], "tree_size")
    _hex32(doc["root_hash"], "root_hash")
    _hex32(doc["chain_head_hash"], "chain_head_hash")
    timestamp = doc["timestamp"]
    if not isinstance(timestamp, int | float) or isinstance(timestamp, bool) or not math.isfinite(timestamp):
        raise FormatError("timestamp must be a finite number")
    if not isinstance(doc["key_id"], str) or not isinstance(doc["signature"], str):
        raise FormatError("key_id and signature must be strings")
    if tag == CHECKPOINT_FORMAT_V2:
        if not isinstance(doc["database_id"], str) or not doc["database_id"]:
            raise FormatError("database_id must be a non-empty string")
        leaf_prefixes(doc)
    previous = doc.get("previous")
    if previous is not None:
        if not isinstance(previous, dict):
            raise FormatError("previous must be an object or null")
        count_field(previous.get("tree_size"), "previous.tree_size")
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
    start = count_field(leaves.get("start"), "leaves.start")
    try:
        data = base64.b64decode(leaves.get("prefixes", ""), validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise FormatError("leaves.prefixes is not base64") from None
    size = count_field(checkpoint.get("tree_size"), "tree_size")
    if len(data) != (size - start) * LEAF_PREFIX_BYTES:
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


def trusted_keys(public_key: Ed25519PublicKey | Sequence[Ed25519PublicKey]) -> list[Ed25519PublicKey]:
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

