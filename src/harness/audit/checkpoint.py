"""Signed Merkle checkpoints published outside the database (SPEC A3b).

A checkpoint is an immutable JSON file ``checkpoint-NNNNNNNN.json`` in a directory (``--dir``,
HARNESS_CHECKPOINT_DIR, default ``./harness-checkpoints``; point it at WORM storage in production).
It holds the RFC 9162 tree head of the whole chain, signed with Ed25519, and a consistency proof from
the checkpoint before it. Whoever later rewrites the trace table, even with a recomputed chain and
chain head, cannot reproduce the signed roots.

The signing key is HARNESS_CHECKPOINT_KEY (a PEM file) or, by default, ``checkpoint-key.pem`` in the
directory, generated on first use with mode 0600. Keeping the key beside the checkpoints is the
convenient default, not the strong one: a separate key path keeps a directory writer from re-signing.
The first key's public key is published as ``public-key.pem`` beside the checkpoints (the one auditors
pin), and every key's as ``public-keys/<key id>.pem``.

Rotating the key (`rotate_key`, `harness audit rotate-key`) publishes a checkpoint signed by the new
key that carries an endorsement signed by the current one; from then on only the new key may sign.
A signing key that changes without a rotation is refused, so a misconfigured key never produces
checkpoints nobody can trust.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from harness.adapters.sql.store import SqlStore
from harness.audit import merkle
from harness.audit.chain import GENESIS_HASH, record_bytes
from harness.audit.standalone import (
    CHECKPOINT_FORMAT,
    PUBLIC_KEY_FILE,
    FormatError,
    check_checkpoint,
    endorsement_message,
    key_id_of,
    load_public_key,
    raw_public_key,
    signed_message,
    walk_keys,
)
from harness.errors import BadInputError, StoreError

DEFAULT_DIR = "harness-checkpoints"
DIR_ENV = "HARNESS_CHECKPOINT_DIR"
KEY_ENV = "HARNESS_CHECKPOINT_KEY"
KEY_FILE = "checkpoint-key.pem"
PUBLIC_KEYS_DIR = "public-keys"
_NAME = re.compile(r"^checkpoint-(\d{8})\.json$")


class CheckpointError(BadInputError):
    """A checkpoint directory, file or key cannot be used; the message names the file."""


class TamperedHistoryError(StoreError):
    """The database no longer holds the history a signed checkpoint (or the chain itself) vouches for."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One published, validated checkpoint file."""

    serial: int
    path: Path
    doc: dict[str, Any]

    @property
    def tree_size(self) -> int:
        """How many records (leaves) the signed tree head covers."""
        return int(self.doc["tree_size"])

    @property
    def root_hash(self) -> str:
        """The signed Merkle root, hex."""
        return str(self.doc["root_hash"])

    @property
    def chain_head_hash(self) -> str:
        """The hash of record `tree_size` when the checkpoint was taken."""
        return str(self.doc["chain_head_hash"])

    def summary(self) -> dict[str, Any]:
        """The fields an operator or an export needs to name this checkpoint."""
        fields = ("tree_size", "root_hash", "chain_head_hash", "timestamp", "key_id")
        return {"file": self.path.name, "serial": self.serial, **{f: self.doc[f] for f in fields}}


def checkpoint_dir(option: str | Path | None = None) -> Path:
    """The checkpoint directory: the option, HARNESS_CHECKPOINT_DIR, or ./harness-checkpoints."""
    return Path(option or os.environ.get(DIR_ENV) or DEFAULT_DIR).expanduser()


# ---------------------------------------------------------------------- keys


def _read_private_key(path: Path) -> Ed25519PrivateKey:
    if os.name == "posix" and path.stat().st_mode & 0o077:
        raise CheckpointError(f"signing key {path} is readable by other users: chmod 600 it")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"signing key {path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CheckpointError(f"signing key {path} is not an Ed25519 key")
    return key


def _create_private_key(path: Path) -> Ed25519PrivateKey:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        # another publisher generated it first: use theirs
        return _read_private_key(path)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return key


def signing_key(directory: Path) -> Ed25519PrivateKey:
    """The Ed25519 key named by HARNESS_CHECKPOINT_KEY, else the directory's (generated on first use)."""
    configured = os.environ.get(KEY_ENV)
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file():
            raise CheckpointError(f"{KEY_ENV} names {path}, which is not a file")
        return _read_private_key(path)
    path = directory / KEY_FILE
    return _read_private_key(path) if path.exists() else _create_private_key(path)


def public_key(directory: Path) -> Ed25519PublicKey:
    """The public key published in the checkpoint directory."""
    path = directory / PUBLIC_KEY_FILE
    try:
        return load_public_key(path.read_bytes())
    except OSError as exc:
        raise CheckpointError(f"cannot read the public key {path}: {exc.strerror}") from None
    except FormatError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def _publish_public_key(directory: Path, key: Ed25519PublicKey) -> None:
    """`public-keys/<key id>.pem` for every key that signs here; `public-key.pem` for the first."""
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (directory / PUBLIC_KEYS_DIR).mkdir(exist_ok=True)
    for path in (directory / PUBLIC_KEYS_DIR / f"{key_id_of(key)}.pem", directory / PUBLIC_KEY_FILE):
        if not path.exists():
            _write_new(path, pem)


def current_key(directory: Path, checkpoints: list[Checkpoint] | None = None) -> Ed25519PublicKey | None:
    """The key that signed the directory's newest checkpoint, trusted from the first published key
    through every endorsement (None when there is no checkpoint); CheckpointError when the directory's
    history does not hold (an unendorsed key, a bad signature)."""
    checkpoints = list_checkpoints(directory) if checkpoints is None else checkpoints
    if not checkpoints:
        return None
    for cp, (key, problem) in zip(checkpoints, walk_keys([cp.doc for cp in checkpoints], [public_key(directory)]),
                                  strict=True):
        if key is None:
            raise CheckpointError(f"{cp.path.name}: {problem}")
    return key


# ---------------------------------------------------------------------- files


def _write_new(path: Path, data: bytes) -> None:
    """Write a file that must not exist yet, all or nothing: a partial file never appears at `path`."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    try:
        os.link(tmp, path)  # fails if `path` exists: checkpoints are never overwritten
    except FileExistsError:
        raise CheckpointError(f"{path} exists: checkpoints are immutable (another publisher?)") from None
    finally:
        tmp.unlink()
    path.chmod(0o444)


def load_checkpoint(path: Path) -> Checkpoint:
    """Read and validate one checkpoint file (shape only; signatures are checked by the caller)."""
    match = _NAME.match(path.name)
    if match is None:
        raise CheckpointError(f"{path.name} is not named checkpoint-NNNNNNNN.json")
    try:
        doc = check_checkpoint(json_load(path))
    except FormatError as exc:
        raise CheckpointError(f"checkpoint {path}: {exc}") from None
    return Checkpoint(int(match.group(1)), path, doc)


def json_load(path: Path) -> Any:
    """Parse a JSON file, naming it in the error."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None


def list_checkpoints(directory: Path) -> list[Checkpoint]:
    """Every checkpoint in the directory, oldest first; none when the directory does not exist."""
    if not directory.is_dir():
        return []
    return sorted((load_checkpoint(p) for p in directory.glob("checkpoint-*.json")), key=lambda c: c.serial)


def latest_checkpoint(directory: Path) -> Checkpoint | None:
    """The newest checkpoint in the directory, if any."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


# ---------------------------------------------------------------------- trees


def leaf_hashes(store: SqlStore, size: int, head_hash: str | None = None) -> Iterator[bytes]:
    """The leaf hashes of records 1..size, checking the chain as it goes (a tree over a broken chain
    would vouch for tampered history) and, when given, that record `size` has hash `head_hash`."""
    prev, expected = GENESIS_HASH, 1
    for rec in store.iter_trace(1):
        if rec.seq > size:
            break
        data = record_bytes(rec.seq, rec.record_id, rec.run_id, rec.kind, rec.prev_hash, rec.payload)
        if rec.seq != expected or rec.prev_hash != prev or hashlib.sha256(data).hexdigest() != rec.hash:
            raise TamperedHistoryError(f"the chain is broken at seq {expected}: run `harness audit verify`")
        yield merkle.leaf_hash(data)
        prev, expected = rec.hash, expected + 1
    if expected != size + 1:
        raise TamperedHistoryError(f"the chain holds {expected - 1} records, fewer than {size}")
    if head_hash is not None and prev != head_hash:
        raise TamperedHistoryError(f"record {size} does not match the chain head: run `harness audit verify`")


def build_tree(store: SqlStore, size: int, head_hash: str | None = None) -> merkle.MerkleTree:
    """The Merkle tree over the first `size` chained records."""
    return merkle.MerkleTree.from_leaves(leaf_hashes(store, size, head_hash))


def _previous_block(previous: Checkpoint | None, tree: merkle.MerkleTree) -> Any:
    """The consistency proof from the last checkpoint (whose signature the caller has checked),
    refusing to sign over a rewritten history."""
    if previous is None:
        return None
    if previous.tree_size > tree.size:
        raise TamperedHistoryError(
            f"{previous.path.name} covers {previous.tree_size} records but the chain holds {tree.size}"
        )
    if tree.root(previous.tree_size).hex() != previous.root_hash:
        raise TamperedHistoryError(f"the first {previous.tree_size} records differ from {previous.path.name}")
    return {
        "file": previous.path.name,
        "tree_size": previous.tree_size,
        "root_hash": previous.root_hash,
        "consistency_proof": [p.hex() for p in tree.consistency_proof(previous.tree_size)],
    }


def publish_checkpoint(store: SqlStore, directory: Path, *, key: Ed25519PrivateKey | None = None,
                       endorsed_by: Ed25519PrivateKey | None = None) -> Checkpoint:
    """Drain the outbox, sign the tree head of the whole chain and write it as the next checkpoint.

    The signing key is `key`, else the configured one (signing_key). It must be the key of the newest
    checkpoint, unless `endorsed_by` is that key: then the checkpoint carries its endorsement of the
    new key (a rotation, see rotate_key)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = key or signing_key(directory)
    pub = key.public_key()
    checkpoints = list_checkpoints(directory)
    signer = current_key(directory, checkpoints)
    if endorsed_by is not None and (signer is None or key_id_of(endorsed_by.public_key()) != key_id_of(signer)):
        raise CheckpointError("only the key that signed the newest checkpoint can endorse the next key")
    if signer is not None and endorsed_by is None and key_id_of(signer) != key_id_of(pub):
        raise CheckpointError(
            f"the signing key {key_id_of(pub)[:16]}… is not the key of {checkpoints[-1].path.name} "
            f"({key_id_of(signer)[:16]}…): to change keys, rotate with `harness audit rotate-key`; after a "
            f"rotation, point {KEY_ENV} at the new key")
    _publish_public_key(directory, pub)
    store.drain_all()
    size, head_hash = store.chain_head()
    tree = build_tree(store, size, head_hash)
    previous = checkpoints[-1] if checkpoints else None
    head: dict[str, Any] = {
        "tree_size": size,
        "root_hash": tree.root().hex(),
        "timestamp": store.clock.now(),
        "chain_head_hash": head_hash,
        "key_id": key_id_of(pub),
    }
    doc: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT,
        **head,
        "signature": base64.b64encode(key.sign(signed_message(head))).decode("ascii"),
        "previous": _previous_block(previous, tree),
    }
    if endorsed_by is not None:
        by = key_id_of(endorsed_by.public_key())
        doc["endorsement"] = {
            "public_key": raw_public_key(pub), "by_key_id": by,
            "signature": base64.b64encode(endorsed_by.sign(endorsement_message(head["key_id"], by, head))).decode(),
        }
    serial = previous.serial + 1 if previous else 1
    path = directory / f"checkpoint-{serial:08d}.json"
    _write_new(path, (json_dumps(doc) + "\n").encode("utf-8"))
    return Checkpoint(serial, path, doc)


def rotate_key(store: SqlStore, directory: Path, new_key: Path | None = None) -> tuple[Checkpoint, Path]:
    """Change the signing key: publish a checkpoint signed by the new key and endorsed by the current
    one; returns it and the path of the new private key.

    With `new_key` (a PEM file, mode 0600) that key is used, and HARNESS_CHECKPOINT_KEY must then name it.
    Without it a new key replaces the directory's own ``checkpoint-key.pem`` (the retired key is gone
    from the directory); with HARNESS_CHECKPOINT_KEY set a new key path is required, as harness writes
    no key outside the checkpoint directory."""
    signer = current_key(directory)
    if signer is None:
        raise CheckpointError(f"no checkpoint in {directory} yet: there is no key to rotate from")
    old = signing_key(directory)
    if key_id_of(old.public_key()) != key_id_of(signer):
        raise CheckpointError("the configured signing key did not sign the newest checkpoint, so it cannot "
                              "endorse a new key")
    if new_key is not None:
        key = _read_private_key(new_key)
        if key_id_of(key.public_key()) == key_id_of(signer):
            raise CheckpointError(f"{new_key} is the current signing key: give a new one")
        return publish_checkpoint(store, directory, key=key, endorsed_by=old), new_key
    if os.environ.get(KEY_ENV):
        raise CheckpointError(f"{KEY_ENV} names the signing key: give the new key with --new-key, then point "
                              f"{KEY_ENV} at it")
    staged = directory / f".{KEY_FILE}.next"
    staged.unlink(missing_ok=True)
    key = _create_private_key(staged)
    try:
        checkpoint = publish_checkpoint(store, directory, key=key, endorsed_by=old)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    os.replace(staged, directory / KEY_FILE)
    return checkpoint, directory / KEY_FILE


def json_dumps(doc: Any) -> str:
    """Checkpoint and export files: indented, keys sorted, so they diff well."""
    return json.dumps(doc, indent=2, sort_keys=True)
