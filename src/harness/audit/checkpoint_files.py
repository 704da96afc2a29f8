"""A checkpoint directory as it is published: the checkpoint files (read and their shape checked), the public
keys beside them (`public-key.pem`, the first, the one auditors pin; `public-keys/<key id>.pem`, every key
that signs here), and which key signs now. What writes a checkpoint is harness.audit.checkpoint; what checks
the signatures of a whole directory is harness.audit.verify_checkpoints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from harness.audit.files import json_load, write_new
from harness.audit.formats import (
    PUBLIC_KEY_FILE,
    FormatError,
    check_checkpoint,
    database_of,
    key_id_of,
    load_public_key,
    walk_keys,
)
from harness.audit.keys import CheckpointError
from harness.audit.places import DEFAULT_DIR

PUBLIC_KEYS_DIR = "public-keys"
_NAME = re.compile(r"^checkpoint-(\d{8})\.json$")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One published, validated checkpoint file; `witnessed` says, per witness it was offered to, None
    (kept) or why not."""

    serial: int
    path: Path
    doc: dict[str, Any]
    witnessed: tuple[tuple[str, str | None], ...] = ()

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

    @property
    def database_id(self) -> str | None:
        """The database it covers; None for a checkpoint of an earlier version (it names none)."""
        return database_of(self.doc)

    def summary(self) -> dict[str, Any]:
        """The fields an operator or an export needs to name this checkpoint."""
        fields = ("tree_size", "root_hash", "chain_head_hash", "timestamp", "key_id")
        return {"file": self.path.name, "serial": self.serial, "database_id": self.database_id,
                **{f: self.doc[f] for f in fields}}


def public_key(directory: Path) -> Ed25519PublicKey:
    """The public key published in the checkpoint directory."""
    path = directory / PUBLIC_KEY_FILE
    try:
        return load_public_key(path.read_bytes())
    except OSError as exc:
        raise CheckpointError(f"cannot read the public key {path}: {exc.strerror}") from None
    except FormatError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def public_pem(key: Ed25519PublicKey) -> bytes:
    """A public key as PEM (SubjectPublicKeyInfo)."""
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def publish_public_key(directory: Path, key: Ed25519PublicKey) -> None:
    """`public-keys/<key id>.pem` for every key that signs here; `public-key.pem` for the first."""
    (directory / PUBLIC_KEYS_DIR).mkdir(exist_ok=True)
    for path in (directory / PUBLIC_KEYS_DIR / f"{key_id_of(key)}.pem", directory / PUBLIC_KEY_FILE):
        if not path.exists():
            write_new(path, public_pem(key))


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


def list_checkpoints(directory: Path) -> list[Checkpoint]:
    """Every checkpoint in the directory, oldest first; none when the directory does not exist."""
    if not directory.is_dir():
        return []
    return sorted((load_checkpoint(p) for p in directory.glob("checkpoint-*.json")), key=lambda c: c.serial)


def latest_checkpoint(directory: Path) -> Checkpoint | None:
    """The newest checkpoint in the directory, if any (only that file is read)."""
    if not directory.is_dir():
        return None
    names = sorted(p for p in directory.glob("checkpoint-*.json") if _NAME.match(p.name))
    return load_checkpoint(names[-1]) if names else None


def refuse_other_database(directory: Path, checkpoints: list[Checkpoint], database_id: str) -> None:
    """A directory holds one database's checkpoints: its sequence, its keys."""
    other = next((cp.database_id for cp in reversed(checkpoints) if cp.database_id not in (None, database_id)), None)
    if other is not None:
        raise CheckpointError(f"{directory} holds checkpoints of database {other}, and this is database "
                              f"{database_id}: give each database its own directory (the default, "
                              f"./{DEFAULT_DIR}/<database id>, is)")
