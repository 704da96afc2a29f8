"""The checkpoint signing key in a process of its own (harness.ports.signer): a real `harness signer serve` holds
the key, and a harness process with HARNESS_SIGNER_SOCKET signs every checkpoint through it, reading no key file;
the signer signs nothing but checkpoint tree heads of its own key, and never two roots for one tree size."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from harness.adapters.signer_socket import SocketSigner
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit.checkpoint import publish_checkpoint
from harness.audit.formats import CHECKPOINT_FORMAT_V2, key_id_of, signed_message
from harness.audit.keys import CheckpointError, create_private_key
from harness.audit.publisher import CheckpointPublisher
from harness.cli import app
from harness.drive.state_machine import StateMachine
from harness.settings import Settings
from harness.wiring.signer import checkpoint_signer
from tests.integration.test_checkpoint_export import SUCCESS, drive


@pytest.fixture(scope="module")
def signer_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Ed25519PrivateKey]:
    """The signer's key, in a folder of its own (mode 0700), not the harness's key folder."""
    path = tmp_path_factory.mktemp("signer-home") / "keys" / "checkpoint.pem"
    return path, create_private_key(path)


def _start(socket_path: Path, key: Path, *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "signer", "serve", "--socket", str(socket_path),
                             "--key", str(key), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the signer exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(socket_path))
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the signer did not start listening")


@pytest.fixture(scope="module")
def signer_socket(tmp_path_factory: pytest.TempPathFactory, signer_key: tuple[Path, Ed25519PrivateKey]
                  ) -> Iterator[Path]:
    """One running signer process for the module; it stops on SIGTERM and removes its socket."""
    socket_path = tmp_path_factory.mktemp("signer-run") / "signer.sock"
    proc = _start(socket_path, signer_key[0])
    yield socket_path
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert not socket_path.exists()


@pytest.fixture
def signer(signer_socket: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This (harness) process pointed at the signer, with an empty key folder of its own."""
    monkeypatch.setenv("HARNESS_SIGNER_SOCKET", str(signer_socket))
    monkeypatch.setenv("HARNESS_CHECKPOINT_KEY_DIR", str(tmp_path / "harness-keys"))
    monkeypatch.delenv("HARNESS_CHECKPOINT_KEY", raising=False)
    return signer_socket


def test_checkpoints_signed_through_the_signer_process_verify(signer: Path, store: SqlStore, machine: StateMachine,
                                                             signer_key: tuple[Path, Ed25519PrivateKey],
                                                             db_path: Path, tmp_path: Path) -> None:
    """`harness audit checkpoint` in a process with HARNESS_SIGNER_SOCKET signs through the signer: the checkpoints
    carry the signer's key, `harness audit verify` accepts them, and this process neither read nor made a key."""
    cpdir, runner = tmp_path / "checkpoints", CliRunner()
    for _ in range(2):
        drive(machine, SUCCESS)
        store.drain_all()
        out = runner.invoke(app, ["audit", "checkpoint", "--db", str(db_path), "--dir", str(cpdir), "--json"])
        assert out.exit_code == 0, out.output
    docs = [json.loads(p.read_text()) for p in sorted(cpdir.glob("checkpoint-*.json"))]
    assert [d["key_id"] for d in docs] == [key_id_of(signer_key[1].public_key())] * 2
    verified = runner.invoke(app, ["audit", "verify", "--db", str(db_path), "--checkpoint-dir", str(cpdir),
                                   "--require-checkpoint", "--json"])
    assert verified.exit_code == 0, verified.output
    assert json.loads(verified.stdout)["checkpoints_checked"] == 2
    assert not (tmp_path / "harness-keys").exists()  # no key was read or generated in this process
    assert Settings.from_env().signer_socket == signer


def test_a_services_publisher_signs_through_the_signer(signer: Path, store: SqlStore, machine: StateMachine,
                                                      signer_key: tuple[Path, Ed25519PrivateKey],
                                                      tmp_path: Path) -> None:
    """The periodic publisher a service runs, built from the settings, signs through the signer process."""
    drive(machine, SUCCESS)
    publisher = CheckpointPublisher.from_settings(SqlAuditReads(store), 60.0, tmp_path / "cp", (),
                                                  signer=checkpoint_signer(Settings.from_env()))
    cp = publisher.publish_if_due()
    assert cp is not None and cp.doc["key_id"] == key_id_of(signer_key[1].public_key())


def test_a_process_pointed_at_a_signer_never_signs_itself(signer: Path, store: SqlStore, machine: StateMachine,
                                                         db_path: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With HARNESS_SIGNER_SOCKET set, a code path that was given no signer is refused instead of generating a key;
    a signer that is not running is named in a clear error (exit 2), not a traceback."""
    drive(machine, SUCCESS)
    with pytest.raises(CheckpointError, match="lives in the signer process"):
        publish_checkpoint(SqlAuditReads(store), tmp_path / "cp")
    assert not (tmp_path / "harness-keys").exists()
    monkeypatch.setenv("HARNESS_SIGNER_SOCKET", str(tmp_path / "nobody.sock"))
    out = CliRunner().invoke(app, ["audit", "checkpoint", "--db", str(db_path), "--dir", str(tmp_path / "cp")])
    assert out.exit_code == 2 and "cannot be reached" in out.output and "Traceback" not in out.output


def _head(key: Ed25519PrivateKey, *, size: int, root: str, database: str = "db-1") -> dict[str, object]:
    return {"format": CHECKPOINT_FORMAT_V2, "tree_size": size, "root_hash": root, "timestamp": 1.5,
            "chain_head_hash": "ab" * 32, "key_id": key_id_of(key.public_key()), "database_id": database,
            "leaves": {"from": 0, "prefixes": ""}}


def test_the_signer_signs_only_checkpoint_heads_and_never_a_fork(signer: Path,
                                                                 signer_key: tuple[Path, Ed25519PrivateKey]) -> None:
    """Whoever can reach the socket gets no signing oracle: arbitrary bytes, a head naming another key and a
    second root for a tree size already signed are refused; a well-formed head is signed with the key."""
    client, key = SocketSigner(signer), signer_key[1]
    with pytest.raises(CheckpointError, match="signs only"):
        client.sign(b"transfer 1000 EUR")
    with pytest.raises(CheckpointError, match="not this signer's"):
        client.sign(signed_message(_head(Ed25519PrivateKey.generate(), size=3, root="00" * 32)))
    message = signed_message(_head(key, size=3, root="11" * 32, database="db-fork"))
    key.public_key().verify(client.sign(message), message)
    key.public_key().verify(client.sign(message), message)  # the same head again: fine (another replica)
    with pytest.raises(CheckpointError, match="different root was signed for tree size 3"):
        client.sign(signed_message(_head(key, size=3, root="22" * 32, database="db-fork")))
    assert client.public_key() == key.public_key().public_bytes_raw()


def test_the_signer_serves_only_its_databases(tmp_path: Path, signer_key: tuple[Path, Ed25519PrivateKey]) -> None:
    """`--database` limits what it signs to those databases' checkpoints."""
    socket_path = tmp_path / "only.sock"  # a second signer process, of the same key
    proc = _start(socket_path, signer_key[0], "--database", "db-1")
    try:
        client, key = SocketSigner(socket_path), signer_key[1]
        client.sign(signed_message(_head(key, size=1, root="33" * 32)))
        with pytest.raises(CheckpointError, match="does not sign for database db-2"):
            client.sign(signed_message(_head(key, size=1, root="33" * 32, database="db-2")))
    finally:
        proc.terminate()
        proc.wait(10)


def test_signer_serve_names_a_bad_key(tmp_path: Path) -> None:
    """A key file that is missing or readable by others is refused with exit 2 and the reason."""
    runner = CliRunner()
    out = runner.invoke(app, ["signer", "serve", "--socket", str(tmp_path / "s.sock"),
                              "--key", str(tmp_path / "no.pem")])
    assert out.exit_code == 2 and "no such file" in out.output
    loose = tmp_path / "loose.pem"
    create_private_key(loose)
    loose.chmod(0o644)
    out = runner.invoke(app, ["signer", "serve", "--socket", str(tmp_path / "s.sock"), "--key", str(loose)])
    assert out.exit_code == 2 and "readable by other users" in out.output
