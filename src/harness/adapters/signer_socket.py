"""The checkpoint signer in a process of its own, over a Unix socket (harness.ports.signer.Signer).

`harness signer serve --socket PATH --key KEY.pem` holds the key; a harness process with
HARNESS_SIGNER_SOCKET=PATH asks it to sign, and holds no key itself, so no process that runs skills can read
the key. The wire is one JSON line each way per connection::

    {"op": "public_key"}                     -> {"ok": true, "public_key": "<base64 of 32 raw bytes>"}
    {"op": "sign", "message": "<base64>"}     -> {"ok": true, "signature": "<base64 of 64 bytes>"}
    anything refused                         -> {"ok": false, "error": "why"}

The server is not a signing oracle: it signs only a checkpoint tree head (the exact bytes of
harness.audit.formats.signed_message for format 2, in canonical form), of the databases it was told to
(`--database`, default any), and never two different roots for one tree size of one database (a rewritten
history of the same length). It answers only peers whose uid it allows (SO_PEERCRED; default its own), and
logs every signature on stderr.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import os
import socket
import socketserver
import stat
import struct
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness.audit.formats import CHECKPOINT_FORMAT_V2, HEAD_FIELDS_V2, key_id_of
from harness.audit.keys import CheckpointError
from harness.domain.chain import canonical_json

__all__ = ["SignerServer", "SocketSigner"]

log = logging.getLogger("harness.signer")
#: the longest request or answer line (a tree head with a million leaf prefixes is ~11 MiB of base64)
MAX_LINE = 32 * 1024 * 1024


def _read_line(conn: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if b"\n" in chunk or size > MAX_LINE:
            break
    data = b"".join(chunks)
    return data.split(b"\n", 1)[0]


class SocketSigner:
    """The client: asks the signer process at `path` (harness.ports.signer.Signer)."""

    def __init__(self, path: Path, *, timeout_s: float = 30.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._public: bytes | None = None

    def public_key(self) -> bytes:
        """The signer's public key (asked once)."""
        if self._public is None:
            raw = self._bytes(self._ask({"op": "public_key"}), "public_key")
            if len(raw) != 32:
                raise CheckpointError(f"the signer at {self.path} answered a public key of {len(raw)} bytes, not 32")
            self._public = raw
        return self._public

    def sign(self, message: bytes) -> bytes:
        """The signer's signature of `message` (CheckpointError naming why it refused)."""
        return self._bytes(self._ask({"op": "sign", "message": base64.b64encode(message).decode("ascii")}),
                           "signature")

    def _bytes(self, answer: dict[str, Any], field: str) -> bytes:
        try:
            return base64.b64decode(str(answer[field]), validate=True)
        except (KeyError, binascii.Error):
            raise CheckpointError(f"the signer at {self.path} answered without a valid {field}") from None

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(self.timeout_s)
                conn.connect(str(self.path))
                conn.sendall(json.dumps(request).encode("utf-8") + b"\n")
                line = _read_line(conn)
        except OSError as exc:
            raise CheckpointError(f"the signer at {self.path} cannot be reached (HARNESS_SIGNER_SOCKET): "
                                  f"{exc.strerror or exc}") from None
        try:
            answer = json.loads(line)
        except ValueError:
            raise CheckpointError(f"the signer at {self.path} answered something that is not JSON") from None
        if not isinstance(answer, dict) or answer.get("ok") is not True:
            why = answer.get("error") if isinstance(answer, dict) else None
            raise CheckpointError(f"the signer at {self.path} refused: {why or 'no reason given'}")
        return answer


class SignerServer:
    """The signer process's side: the key, the socket, and what it agrees to sign."""

    def __init__(self, path: Path, key: Ed25519PrivateKey, *, allowed_uids: Iterable[int] = (),
                 databases: Iterable[str] = ()) -> None:
        self.path = path
        self.key = key
        self.public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.allowed_uids = frozenset(allowed_uids) or frozenset({os.geteuid()})
        self.databases = frozenset(databases)
        #: (database id, tree size) -> the root signed for it: one root per size, ever (this process's life)
        self._signed: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()
        self._server: socketserver.ThreadingUnixStreamServer | None = None

    def open(self) -> None:
        """Bind the socket (mode 0600, or 0666 when other uids are allowed: SO_PEERCRED decides)."""
        if self.path.exists() or self.path.is_symlink():
            if not stat.S_ISSOCK(self.path.lstat().st_mode):
                raise CheckpointError(f"{self.path} exists and is not a socket")
            if _listening(self.path):
                raise CheckpointError(f"a signer already serves {self.path}")
            self.path.unlink()
        owner = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                owner.handle(self.request)

        old = os.umask(0o177)
        try:
            self._server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        finally:
            os.umask(old)
        self._server.daemon_threads = True
        if self.allowed_uids != {os.geteuid()}:
            self.path.chmod(0o666)

    def serve_forever(self) -> None:
        """Answer until `stop` is called from another thread; then close the socket and remove it."""
        if self._server is None:
            self.open()
        assert self._server is not None
        try:
            self._server.serve_forever()
        finally:
            self._server.server_close()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def stop(self) -> None:
        """Make `serve_forever` return (it waits for that: call it from another thread)."""
        server = self._server
        if server is not None:
            server.shutdown()

    # ------------------------------------------------------------------ one connection
    def handle(self, conn: socket.socket) -> None:
        """Answer one request on `conn`."""
        conn.settimeout(10.0)
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
        try:
            if uid not in self.allowed_uids:
                raise CheckpointError(f"uid {uid} may not ask this signer")
            answer = self._answer(json.loads(_read_line(conn)), pid, uid)
        except CheckpointError as exc:
            log.warning("signer refused pid %d uid %d: %s", pid, uid, exc)
            answer = {"ok": False, "error": str(exc)}
        except (ValueError, TypeError, KeyError):
            answer = {"ok": False, "error": "not a signer request"}
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(answer).encode("utf-8") + b"\n")

    def _answer(self, request: dict[str, Any], pid: int, uid: int) -> dict[str, Any]:
        if request.get("op") == "public_key":
            return {"ok": True, "public_key": base64.b64encode(self.public).decode("ascii")}
        if request.get("op") != "sign":
            raise CheckpointError(f"unknown op {request.get('op')!r}")
        message = base64.b64decode(str(request["message"]), validate=True)
        head = self._checkpoint_head(message)
        with self._lock:
            where = (str(head["database_id"]), int(head["tree_size"]))
            signed = self._signed.get(where)
            if signed is not None and signed != head["root_hash"]:
                raise CheckpointError(f"database {where[0]}: a different root was signed for tree size {where[1]} "
                                      "already (a rewritten history)")
            self._signed[where] = str(head["root_hash"])
        log.warning("signed the checkpoint of database %s at tree size %d for pid %d uid %d", where[0], where[1],
                    pid, uid)
        return {"ok": True, "signature": base64.b64encode(self.key.sign(message)).decode("ascii")}

    def _checkpoint_head(self, message: bytes) -> dict[str, Any]:
        """The tree head `message` is, or CheckpointError: this signer signs nothing else."""
        tag, _, body = message.decode("utf-8").partition("\n")
        if tag != CHECKPOINT_FORMAT_V2:
            raise CheckpointError(f"this signer signs only {CHECKPOINT_FORMAT_V2} tree heads")
        head = json.loads(body)
        if not isinstance(head, dict) or set(head) != set(HEAD_FIELDS_V2) or canonical_json(head) != body:
            raise CheckpointError("not a canonical checkpoint tree head")
        key_id = head["key_id"]
        if key_id != key_id_of(self.key.public_key()):
            raise CheckpointError(f"the tree head names key {str(key_id)[:16]}…, not this signer's")
        if self.databases and head["database_id"] not in self.databases:
            raise CheckpointError(f"this signer does not sign for database {head['database_id']}")
        return head


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
