"""The signer port: what signs checkpoints (SPEC A3b), so that the key need not live in the process that runs
skills.

Two adapters: the in-process one holds the key file (harness.audit.keys.KeySigner, the default), and the
local-socket one asks a separate `harness signer serve` process over a Unix socket
(harness.adapters.signer_socket), chosen by HARNESS_SIGNER_SOCKET in the composition root.
"""

from __future__ import annotations

from typing import Protocol


class Signer(Protocol):
    """Signs the exact bytes of a checkpoint's tree head (harness.audit.formats.signed_message) with an Ed25519
    key; a signer that refuses, or cannot be reached, raises harness.audit.keys.CheckpointError naming why."""

    def public_key(self) -> bytes:
        """The raw 32 bytes of the key's public half."""
        ...

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of `message`."""
        ...
