"""Where the checkpoint signing key lives (SPEC A3b): never beside the checkpoints.

Whoever can write the checkpoint directory could, holding the key too, delete a checkpoint and sign
over a rewritten chain. So the key is HARNESS_CHECKPOINT_KEY (a PEM file) or, by default, one key per
database in a private key folder, ``HARNESS_CHECKPOINT_KEY_DIR`` (default
``$XDG_CONFIG_HOME/harness/keys``, i.e. ``~/.config/harness/keys``, created mode 0700), named
``<database id>.pem`` and generated on first use with mode 0600. A key readable by anyone but its owner
is refused, and so is a key inside the checkpoint directory.

Or the key lives in another process: with HARNESS_SIGNER_SOCKET set, a `harness signer serve` process
holding the key signs over a Unix socket (harness.adapters.signer_socket), and this process reads no key
at all (`signing_key` refuses, so no path of it creates one by mistake). `KeySigner` is the in-process
signer (harness.ports.signer.Signer) over a key this process holds.

Versions before this one kept ``checkpoint-key.pem`` in the checkpoint directory. Such a key is
refused with the command that moves it (`harness audit move-key`), so nobody signs with it by accident
from the old place; the key itself stays valid (it signed the directory's checkpoints).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness.domain.errors import BadInputError

KEY_ENV = "HARNESS_CHECKPOINT_KEY"
KEY_DIR_ENV = "HARNESS_CHECKPOINT_KEY_DIR"
SIGNER_SOCKET_ENV = "HARNESS_SIGNER_SOCKET"
#: where versions before 0013 kept the key: inside the checkpoint directory
LEGACY_KEY_FILE = "checkpoint-key.pem"


class CheckpointError(BadInputError):
    """A checkpoint directory, file or signing key cannot be used; the message names the file."""


def key_dir() -> Path:
    """The private folder of default signing keys."""
    configured = os.environ.get(KEY_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(config_home) / "harness" / "keys"


def default_key_path(database_id: str) -> Path:
    """The default signing key of one database."""
    return key_dir() / f"{database_id}.pem"


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
    except ValueError:
        return False
    return True


def key_path(directory: Path, database_id: str) -> Path:
    """The signing key's path for checkpoints published in `directory`: HARNESS_CHECKPOINT_KEY, else the
    database's default key. Refuses a key in the checkpoint directory, where a directory writer could
    take it, and the old layout's key there."""
    legacy = directory / LEGACY_KEY_FILE
    configured = os.environ.get(KEY_ENV)
    path = Path(configured).expanduser() if configured else default_key_path(database_id)
    if _inside(path, directory) or legacy.exists():
        found = path if _inside(path, directory) else legacy
        raise CheckpointError(
            f"the signing key {found} is inside the checkpoint directory, where whoever can write checkpoints "
            f"could take it and re-sign a rewritten history: move it out with `harness audit move-key` "
            f"(to {default_key_path(database_id)}, mode 0600), or move it elsewhere and point {KEY_ENV} at it")
    return path


def read_private_key(path: Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file readable by its owner only."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise CheckpointError(f"cannot read the signing key {path}: {exc.strerror}") from None
    if os.name == "posix" and mode & 0o077:
        raise CheckpointError(f"signing key {path} is readable by other users: chmod 600 it")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"signing key {path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CheckpointError(f"signing key {path} is not an Ed25519 key")
    return key


def create_private_key(path: Path) -> Ed25519PrivateKey:
    """Generate a key at `path` (mode 0600, its folder 0700 when created); another process's key wins a
    race to create it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
    tmp = Path(name)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(tmp, path)  # whole or not at all: a process racing to read it never sees half a key
    except FileExistsError:
        return read_private_key(path)
    finally:
        tmp.unlink()
    return key


class KeySigner:
    """The in-process signer (harness.ports.signer.Signer): a private key this process holds."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key

    def public_key(self) -> bytes:
        """The raw 32 bytes of the public key."""
        return self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def sign(self, message: bytes) -> bytes:
        """The Ed25519 signature of `message`."""
        return self._key.sign(message)


def signing_key(directory: Path, database_id: str) -> Ed25519PrivateKey:
    """The key that signs this database's checkpoints in `directory` (generated on first use, unless
    HARNESS_CHECKPOINT_KEY names it: then it must exist). Refused when HARNESS_SIGNER_SOCKET says the key
    lives in a signer process."""
    if os.environ.get(SIGNER_SOCKET_ENV):
        raise CheckpointError(f"{SIGNER_SOCKET_ENV} is set: the signing key lives in the signer process "
                              f"({os.environ[SIGNER_SOCKET_ENV]}), and this process reads no key file; run this "
                              "where the key is (with HARNESS_CHECKPOINT_KEY), or unset it")
    path = key_path(directory, database_id)
    if os.environ.get(KEY_ENV):
        if not path.is_file():
            raise CheckpointError(f"{KEY_ENV} names {path}, which is not a file")
        return read_private_key(path)
    return read_private_key(path) if path.exists() else create_private_key(path)


def move_legacy_key(directory: Path, database_id: str) -> Path:
    """Move the old layout's key out of the checkpoint directory to the database's default key path;
    returns the new path. Refuses to overwrite a key already there."""
    legacy = directory / LEGACY_KEY_FILE
    if not legacy.exists():
        raise CheckpointError(f"no signing key in {directory} to move")
    read_private_key(legacy)  # a key nobody could use is not moved
    target = default_key_path(database_id)
    if target.exists():
        raise CheckpointError(f"{target} exists already: move {legacy} by hand, or remove one of them")
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.link(legacy, target)  # same file system: atomic, and the target cannot appear half-written
    except OSError:
        data = legacy.read_bytes()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    target.chmod(0o600)
    legacy.unlink()
    return target
