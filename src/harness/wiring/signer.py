"""Who signs the audit checkpoints: this process with its own key file, or a signer process over a socket
(HARNESS_SIGNER_SOCKET), and that process's server (`harness signer serve`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from harness.adapters.signer_socket import SignerServer
    from harness.ports.signer import Signer
    from harness.settings import Settings


def checkpoint_signer(settings: Settings) -> Signer | None:
    """The signer process HARNESS_SIGNER_SOCKET names; None: this process signs with its own key file."""
    if settings.signer_socket is None:
        return None
    from harness.adapters.signer_socket import SocketSigner

    return SocketSigner(settings.signer_socket)


def signer_server(socket_path: Path, key_file: Path, allowed_uids: Sequence[int] = (),
                  databases: Sequence[str] = ()) -> SignerServer:
    """The `harness signer serve` process's server: the key read from `key_file` (mode 0600)."""
    from harness.adapters.signer_socket import SignerServer
    from harness.audit.keys import read_private_key

    return SignerServer(socket_path, read_private_key(key_file), allowed_uids=allowed_uids, databases=databases)
