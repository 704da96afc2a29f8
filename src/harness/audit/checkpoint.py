"""Signed Merkle checkpoints published outside the database (SPEC A3b).

A checkpoint is an immutable JSON file ``checkpoint-NNNNNNNN.json`` in a directory of its database:
``--dir`` or HARNESS_CHECKPOINT_DIR when given, else ``./harness-checkpoints/<database id>`` (one folder
per database, so databases sharing a working folder never mix their checkpoints; point it at WORM storage
in production). It holds the RFC 9162 tree head of the whole chain and the database's id, signed with
Ed25519, the 8-byte prefixes of the leaf hashes it adds (so a verifier names the first record a rewrite
changed), and a consistency proof from the checkpoint before it. Whoever later rewrites the trace table,
even with a recomputed chain and chain head, cannot reproduce the signed roots.

The signing key never sits beside the checkpoints (harness.audit.keys). The first key's public key is
published as ``public-key.pem`` beside the checkpoints (the one auditors pin), and every key's as
``public-keys/<key id>.pem``. Each checkpoint can also go to witnesses (harness.audit.witness), which keep
their own append-only copies and refuse any that does not extend what they hold.

Rotating the key (`rotate_key`, `harness audit rotate-key`) publishes a checkpoint signed by the new
key that carries an endorsement signed by the current one; from then on only the new key may sign.
A signing key that changes without a rotation is refused, so a misconfigured key never produces
checkpoints nobody can trust.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from harness.audit import merkle
from harness.audit.checkpoint_files import (
    Checkpoint,
    current_key,
    list_checkpoints,
    public_pem,
    publish_public_key,
    refuse_other_database,
)
from harness.audit.files import json_dumps, write_new
from harness.audit.formats import (
    CHECKPOINT_FORMAT_V2,
    LEAF_PREFIX_BYTES,
    endorsement_message,
    key_id_of,
    raw_public_key,
    signed_message,
)
from harness.audit.keys import (
    KEY_ENV,
    CheckpointError,
    KeySigner,
    create_private_key,
    default_key_path,
    read_private_key,
    signing_key,
)
from harness.audit.witness import Witness, WitnessError, WitnessRefusedError
from harness.audit.witness_history import HistoryDivergedError, prove_prefix
from harness.domain.audit import PrunedRecord
from harness.domain.chain import GENESIS_HASH, record_bytes
from harness.domain.errors import StoreError
from harness.ports.audit import ChainReads
from harness.ports.signer import Signer

#: a checkpoint signs the leaf prefixes of at most this many new records (8 bytes each); a first checkpoint
#: of a bigger chain names only the range a rewrite changed in it
MAX_SIGNED_LEAVES = 1_000_000


class TamperedHistoryError(StoreError):
    """The database no longer holds the history a signed checkpoint (or the chain itself) vouches for."""


# ---------------------------------------------------------------------- trees


def leaf_hashes(store: ChainReads, size: int, head_hash: str | None = None) -> Iterator[bytes]:
    """The leaf hashes of records 1..size, checking the chain as it goes (a tree over a broken chain
    would vouch for tampered history) and, when given, that record `size` has hash `head_hash`."""
    prev, expected = GENESIS_HASH, 1
    for rec in store.iter_chain():
        if rec.seq > size:
            break
        if isinstance(rec, PrunedRecord):  # a tombstone: the next record's link and the roots check it
            if rec.seq != expected:
                raise TamperedHistoryError(f"the chain is broken at seq {expected}: run `harness audit verify`")
            yield rec.leaf
            prev, expected = rec.hash, expected + 1
            continue
        data = record_bytes(rec.seq, rec.record_id, rec.run_id, rec.kind, rec.prev_hash, rec.payload)
        if rec.seq != expected or rec.prev_hash != prev or hashlib.sha256(data).hexdigest() != rec.hash:
            raise TamperedHistoryError(f"the chain is broken at seq {expected}: run `harness audit verify`")
        yield merkle.leaf_hash(data)
        prev, expected = rec.hash, expected + 1
    if expected != size + 1:
        raise TamperedHistoryError(f"the chain holds {expected - 1} records, fewer than {size}")
    if head_hash is not None and prev != head_hash:
        raise TamperedHistoryError(f"record {size} does not match the chain head: run `harness audit verify`")


def build_tree(store: ChainReads, size: int, head_hash: str | None = None) -> merkle.MerkleTree:
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


def _leaves(tree: merkle.MerkleTree, start: int) -> dict[str, Any] | None:
    """The prefixes of the leaf hashes from `start` on, the part of the tree this checkpoint adds."""
    if tree.size - start > MAX_SIGNED_LEAVES:
        return None
    prefixes = b"".join(tree.leaf(i)[:LEAF_PREFIX_BYTES] for i in range(start, tree.size))
    return {"start": start, "prefix_bytes": LEAF_PREFIX_BYTES, "prefixes": base64.b64encode(prefixes).decode()}


def _check_witnesses(witnesses: Sequence[Witness], database_id: str, tree: merkle.MerkleTree,
                     grow: Callable[[], merkle.MerkleTree]) -> merkle.MerkleTree:
    """Refuse to sign a chain whose history is no prefix of what a witness keeps (rewritten, forked or
    rolled back); the tree to sign, grown to the witness's size when a replica published a bigger one."""
    for witness in witnesses:
        try:
            tree = prove_prefix(witness, database_id, tree, grow)
        except HistoryDivergedError as exc:
            raise TamperedHistoryError(f"the history parted from the one witness {witness.name} keeps "
                                       f"({exc.kind}): {exc}") from None
        except WitnessError:
            continue  # unreachable now: the checkpoint is offered to it again next time
    return tree


#: how often a publisher offers again after a witness answered that another publisher was first (stale)
_STALE_RETRIES = 5


def _offer(witness: Witness, database_id: str, tree: merkle.MerkleTree, checkpoints: list[Checkpoint],
           signer: Ed25519PublicKey, grow: Callable[[], merkle.MerkleTree]) -> str | None:
    """Give the witness every checkpoint of this database it does not hold yet, oldest first (only the
    newest to a witness that holds none), each with a consistency proof from its newest one; None when
    it kept them, or holds a tree head proven to extend them, else why not. Publishers racing each other
    are told "stale" and offer again."""
    for attempt in range(_STALE_RETRIES + 1):
        try:
            _offer_once(witness, database_id, tree, checkpoints, signer, grow)
        except WitnessRefusedError as exc:
            if exc.status == 409 and "stale" in str(exc) and attempt < _STALE_RETRIES:
                continue
            return f"refused: {exc}"
        except HistoryDivergedError as exc:
            return f"{exc.kind}: {exc}"
        except WitnessError as exc:
            return str(exc)
        return None
    return None  # unreachable: the last attempt returns


def _offer_once(witness: Witness, database_id: str, tree: merkle.MerkleTree, checkpoints: list[Checkpoint],
                signer: Ed25519PublicKey, grow: Callable[[], merkle.MerkleTree]) -> None:
    latest = witness.latest(database_id)
    base = int(latest["tree_size"]) if latest else 0
    if base > tree.size:
        # another publisher was first: kept only if its tree head is proven to extend ours
        prove_prefix(witness, database_id, tree, grow)
        return
    ours = [cp for cp in checkpoints if cp.database_id == database_id and cp.tree_size >= base]
    for cp in ours if latest else ours[-1:]:
        proof = {"tree_size": base, "root_hash": tree.root(base).hex(),
                 "proof": [p.hex() for p in tree.consistency_proof(base, cp.tree_size)]} if latest else None
        witness.submit(database_id, cp.doc, public_pem(signer).decode("ascii"), proof)
        base = cp.tree_size


def publish_checkpoint(store: ChainReads, directory: Path, *, key: Ed25519PrivateKey | None = None,
                       endorsed_by: Ed25519PrivateKey | None = None,
                       witnesses: Sequence[Witness] = (),
                       trees: list[merkle.MerkleTree] | None = None, signer: Signer | None = None) -> Checkpoint:
    """Drain the outbox, sign the tree head of the whole chain and write it as the next checkpoint, then
    offer it to the witnesses (their answers are in `Checkpoint.witnessed`).

    The signer is `signer` (a signer process, harness.ports.signer), else `key`, else the configured key
    (keys.signing_key) held by this process. Its key must be the key of the newest
    checkpoint, unless `endorsed_by` is that key: then the checkpoint carries its endorsement of the new
    key (a rotation, see rotate_key). A chain that no longer matches the newest checkpoint, or what a
    witness keeps, is not signed (TamperedHistoryError)."""
    database_id = store.database_id()
    directory.mkdir(parents=True, exist_ok=True)
    if signer is None:
        signer = KeySigner(key or signing_key(directory, database_id))
    pub = Ed25519PublicKey.from_public_bytes(signer.public_key())
    checkpoints = list_checkpoints(directory)
    refuse_other_database(directory, checkpoints, database_id)
    current = current_key(directory, checkpoints)
    if endorsed_by is not None and (current is None or key_id_of(endorsed_by.public_key()) != key_id_of(current)):
        raise CheckpointError("only the key that signed the newest checkpoint can endorse the next key")
    if current is not None and endorsed_by is None and key_id_of(current) != key_id_of(pub):
        raise CheckpointError(
            f"the signing key {key_id_of(pub)[:16]}… is not the key of {checkpoints[-1].path.name} "
            f"({key_id_of(current)[:16]}…): to change keys, rotate with `harness audit rotate-key`; after a "
            f"rotation, point {KEY_ENV} at the new key")
    publish_public_key(directory, pub)
    store.drain_all()
    heads = [store.chain_head()]

    def grow() -> merkle.MerkleTree:  # the chain as it is now, when a witness holds more than we read
        store.drain_all()
        heads.append(store.chain_head())
        return build_tree(store, *heads[-1])

    tree = _check_witnesses(witnesses, database_id, build_tree(store, *heads[0]), grow)
    size, head_hash = next(head for head in reversed(heads) if head[0] == tree.size)
    if trees is not None:  # the caller proves records against this checkpoint next (the archiver)
        trees.append(tree)
    previous = checkpoints[-1] if checkpoints else None
    head: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT_V2,
        "tree_size": size,
        "root_hash": tree.root().hex(),
        "timestamp": store.clock.now(),
        "chain_head_hash": head_hash,
        "key_id": key_id_of(pub),
        "database_id": database_id,
        "leaves": _leaves(tree, previous.tree_size if previous and previous.tree_size <= size else 0),
    }
    doc: dict[str, Any] = {
        **head,
        "signature": base64.b64encode(_signed(signer, pub, signed_message(head))).decode("ascii"),
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
    write_new(path, (json_dumps(doc) + "\n").encode("utf-8"))
    published = [*checkpoints, Checkpoint(serial, path, doc)]
    witnessed = tuple((w.name, _offer(w, database_id, tree, published, pub, grow)) for w in witnesses)
    return Checkpoint(serial, path, doc, witnessed)


def _signed(signer: Signer, pub: Ed25519PublicKey, message: bytes) -> bytes:
    """The signer's signature of `message`, checked: a signer answering with another key's signature (or
    none) signs nothing."""
    signature = signer.sign(message)
    try:
        pub.verify(signature, message)
    except InvalidSignature:
        raise CheckpointError("the signer's signature does not verify with its public key") from None
    return signature


def rotate_key(store: ChainReads, directory: Path, new_key: Path | None = None,
               witnesses: Sequence[Witness] = ()) -> tuple[Checkpoint, Path]:
    """Change the signing key: publish a checkpoint signed by the new key and endorsed by the current
    one; returns it and the path of the new private key.

    With `new_key` (a PEM file, mode 0600) that key is used, and HARNESS_CHECKPOINT_KEY must then name it.
    Without it a new key replaces the database's default key file (keys.default_key_path); with
    HARNESS_CHECKPOINT_KEY set a new key path is required, as harness replaces no key it was pointed at."""
    database_id = store.database_id()
    signer = current_key(directory)
    if signer is None:
        raise CheckpointError(f"no checkpoint in {directory} yet: there is no key to rotate from")
    old = signing_key(directory, database_id)
    if key_id_of(old.public_key()) != key_id_of(signer):
        raise CheckpointError("the configured signing key did not sign the newest checkpoint, so it cannot "
                              "endorse a new key")
    if new_key is not None:
        key = read_private_key(new_key)
        if key_id_of(key.public_key()) == key_id_of(signer):
            raise CheckpointError(f"{new_key} is the current signing key: give a new one")
        return publish_checkpoint(store, directory, key=key, endorsed_by=old, witnesses=witnesses), new_key
    if os.environ.get(KEY_ENV):
        raise CheckpointError(f"{KEY_ENV} names the signing key: give the new key with --new-key, then point "
                              f"{KEY_ENV} at it")
    target = default_key_path(database_id)
    staged = target.with_name(f".{target.name}.next")
    staged.unlink(missing_ok=True)
    key = create_private_key(staged)
    try:
        checkpoint = publish_checkpoint(store, directory, key=key, endorsed_by=old, witnesses=witnesses)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    os.replace(staged, target)
    return checkpoint, target
