"""Rotating the checkpoint signing key (SPEC A3b): trust passes from the first key to the next through
an endorsement on the checkpoint, a retired key signs nothing more, and forgeries are refused."""

from __future__ import annotations

import base64
import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit import formats, standalone
from harness.audit.checkpoint import publish_checkpoint, rotate_key
from harness.audit.checkpoint_files import PUBLIC_KEYS_DIR, Checkpoint, public_key
from harness.audit.export import export_run
from harness.audit.formats import endorsement_message, key_id_of, raw_public_key, signed_message
from harness.audit.keys import KEY_ENV, CheckpointError
from harness.audit.standalone import verify_export, verify_sequence
from harness.audit.verify import verify_chain
from harness.cli import app
from harness.drive.state_machine import StateMachine
from tests.integration.test_checkpoint_export import SUCCESS, drive, key_of, write
from tests.integration.test_tamper import rebuild_chain


@pytest.fixture
def cpdir(tmp_path: Path) -> Path:
    """Where checkpoints are published."""
    return tmp_path / "checkpoints"


def _pem_file(path: Path, key: Ed25519PrivateKey) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(path, 0o600)
    return path


def _rotated(store: SqlStore, machine: StateMachine, cpdir: Path) -> list[Checkpoint]:
    """cp1 by the first key; cp2 by a new key, endorsed by the first (the rotation); cp3 by the new key."""
    drive(machine, SUCCESS)
    first = publish_checkpoint(SqlAuditReads(store), cpdir)
    drive(machine, SUCCESS)
    second, _ = rotate_key(SqlAuditReads(store), cpdir)
    drive(machine, SUCCESS)
    third = publish_checkpoint(SqlAuditReads(store), cpdir)
    return [first, second, third]


def _forge(doc: dict[str, Any], signer: Ed25519PrivateKey, endorser: Ed25519PrivateKey | None = None,
           **head: Any) -> dict[str, Any]:
    """A checkpoint with `head` changed, signed by `signer` and, if given, endorsed by `endorser`."""
    forged = {**copy.deepcopy(doc), **head, "key_id": key_id_of(signer.public_key())}
    forged["signature"] = base64.b64encode(signer.sign(signed_message(forged))).decode()
    forged.pop("endorsement", None)
    if endorser is not None:
        by = key_id_of(endorser.public_key())
        forged["endorsement"] = {
            "public_key": raw_public_key(signer.public_key()), "by_key_id": by,
            "signature": base64.b64encode(endorser.sign(endorsement_message(forged["key_id"], by, forged))).decode(),
        }
    return forged


def test_a_rotation_passes_trust_from_the_first_key_to_the_next(
    store: SqlStore, machine: StateMachine, cpdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whoever pinned the first key verifies checkpoints and exports signed after the rotation."""
    cps = _rotated(store, machine, cpdir)
    anchor = public_key(cpdir)
    old_id, new_id = cps[0].doc["key_id"], cps[1].doc["key_id"]
    assert old_id != new_id and cps[2].doc["key_id"] == new_id
    assert key_id_of(anchor) == old_id  # public-key.pem stays the first key, the one auditors pin
    assert cps[1].doc["endorsement"]["by_key_id"] == old_id and "endorsement" not in cps[2].doc
    assert {p.stem for p in (cpdir / PUBLIC_KEYS_DIR).glob("*.pem")} == {old_id, new_id}
    assert key_id_of(key_of(store).public_key()) == new_id  # the retired private key left the directory

    sequence = verify_sequence([cp.doc for cp in cps], anchor)
    assert sequence.ok, sequence.failures
    assert any("rotated" in n for n in sequence.notes)
    report = verify_chain(SqlAuditReads(store), cpdir)
    assert report.ok and report.checkpoints_checked == 3

    run_id = store.list_runs()[0].run_id
    export = export_run(SqlAuditReads(store), run_id, cps[2])
    alone = verify_export(export, cps[2].doc, anchor)  # one checkpoint, nothing passes trust on to its key
    assert not alone.ok and "not a trusted key" in alone.failures[0]
    assert verify_export(export, cps[2].doc, [anchor, formats.load_public_key(
        (cpdir / PUBLIC_KEYS_DIR / f"{new_id}.pem").read_bytes())]).ok
    endorsing = export_run(SqlAuditReads(store), run_id, cps[1])  # the endorsing checkpoint
    assert verify_export(endorsing, cps[1].doc, anchor).ok

    # the command line trusts public-key.pem and follows the rotation recorded beside the checkpoint
    path = write(tmp_path / "export.json", export)
    assert standalone.main(["export", path, "--checkpoint", str(cps[2].path)]) == 0
    assert "trusted through the key rotation" in capsys.readouterr().out
    assert standalone.main(["consistency", *(str(cp.path) for cp in cps)]) == 0


def test_the_signing_key_cannot_change_without_a_rotation(
    store: SqlStore, machine: StateMachine, cpdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misconfigured key is refused; after a rotation the retired key is refused too."""
    old, new = (_pem_file(tmp_path / name, Ed25519PrivateKey.generate()) for name in ("old.pem", "new.pem"))
    monkeypatch.setenv(KEY_ENV, str(old))
    drive(machine, SUCCESS)
    publish_checkpoint(SqlAuditReads(store), cpdir)
    monkeypatch.setenv(KEY_ENV, str(new))
    with pytest.raises(CheckpointError, match="rotate-key"):
        publish_checkpoint(SqlAuditReads(store), cpdir)
    with pytest.raises(CheckpointError, match="did not sign the newest checkpoint"):
        rotate_key(SqlAuditReads(store), cpdir, new)  # the configured key must be the current one to endorse
    monkeypatch.setenv(KEY_ENV, str(old))
    with pytest.raises(CheckpointError, match="--new-key"):
        rotate_key(SqlAuditReads(store), cpdir)  # harness writes no key outside the checkpoint directory
    with pytest.raises(CheckpointError, match="is the current signing key"):
        rotate_key(SqlAuditReads(store), cpdir, old)
    rotated, key_file = rotate_key(SqlAuditReads(store), cpdir, new)
    assert key_file == new and rotated.doc["endorsement"]["by_key_id"] != rotated.doc["key_id"]
    with pytest.raises(CheckpointError, match="rotate-key"):
        publish_checkpoint(SqlAuditReads(store), cpdir)  # KEY_ENV still names the retired key
    monkeypatch.setenv(KEY_ENV, str(new))
    assert publish_checkpoint(SqlAuditReads(store), cpdir).doc["key_id"] == rotated.doc["key_id"]
    assert verify_chain(SqlAuditReads(store), cpdir).ok


def test_a_rotation_needs_a_checkpoint_to_rotate_from(store: SqlStore, cpdir: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint"):
        rotate_key(SqlAuditReads(store), cpdir)


def test_forged_rotations_are_refused(store: SqlStore, machine: StateMachine, cpdir: Path) -> None:
    """Someone who can write the directory, or who stole the retired key, cannot slip in a key."""
    cps = _rotated(store, machine, cpdir)
    docs = [cp.doc for cp in cps]
    anchor = public_key(cpdir)
    current = key_of(store)
    attacker = Ed25519PrivateKey.generate()

    self_endorsed = _forge(docs[2], attacker, endorser=attacker)
    result = verify_sequence([*docs[:2], self_endorsed], anchor)
    assert not result.ok and "not a trusted key either" in result.failures[0]

    unendorsed = _forge(docs[2], attacker)
    result = verify_sequence([*docs[:2], unendorsed], anchor)
    assert not result.ok and "not a trusted key" in result.failures[0]

    # a stolen key that was rotated away is not enough: after the rotation only the new key may sign or
    # endorse (here the "first key" is one the test holds, standing in for the stolen one)
    stolen = Ed25519PrivateKey.generate()
    history = [_forge(docs[0], stolen), _forge(docs[1], current, endorser=stolen)]
    assert verify_sequence(history, stolen.public_key()).ok
    late = _forge(docs[2], attacker, endorser=stolen)
    result = verify_sequence([*history, late], stolen.public_key())
    assert not result.ok and "checkpoint #3" in result.failures[0]

    # an endorsement is bound to its checkpoint's head and to the key it names
    moved = copy.deepcopy(docs[1])
    moved["endorsement"]["public_key"] = raw_public_key(attacker.public_key())
    result = verify_sequence([docs[0], moved], anchor)
    assert not result.ok and "not the key that signed" in result.failures[0]
    replayed = _forge(docs[1], current, root_hash="ab" * 32)
    replayed["endorsement"] = docs[1]["endorsement"]
    result = verify_sequence([docs[0], replayed], anchor)
    assert not result.ok and "endorsement's signature is invalid" in result.failures[0]

    # the database verifier follows the same rules over the directory
    (cpdir / "checkpoint-00000004.json").write_text(json.dumps(self_endorsed))
    report = verify_chain(SqlAuditReads(store), cpdir)
    assert not report.ok and any(p.kind == "checkpoint_invalid" for p in report.problems)


def test_a_history_rewritten_after_a_rotation_is_detected(store: SqlStore, machine: StateMachine,
                                                          cpdir: Path) -> None:
    """The consistency proofs run straight through the rotation: a rewrite is caught as before."""
    _rotated(store, machine, cpdir)
    rebuild_chain(store, keep=lambda r: True, payload=lambda r: r.payload.replace("to ", "TO "))
    report = verify_chain(SqlAuditReads(store), cpdir)
    assert not report.ok and any(p.kind == "checkpoint_mismatch" for p in report.problems)


def test_rotate_key_on_the_command_line(store: SqlStore, machine: StateMachine, db_path: Path, cpdir: Path,
                                        tmp_path: Path) -> None:
    """`harness audit rotate-key`: one JSON document with --json, exit 2 without a traceback for bad input."""
    drive(machine, SUCCESS)
    store.drain_all()
    runner = CliRunner()
    args = ["--db", str(db_path), "--dir", str(cpdir)]
    assert runner.invoke(app, ["audit", "checkpoint", *args]).exit_code == 0
    done = runner.invoke(app, ["audit", "rotate-key", *args, "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["endorsed_by"] != result["key_id"] and result["file"] == "checkpoint-00000002.json"
    assert runner.invoke(app, ["audit", "verify", "--db", str(db_path), "--checkpoint-dir", str(cpdir)]).exit_code == 0
    missing = runner.invoke(app, ["audit", "rotate-key", *args, "--new-key", str(tmp_path / "missing.pem")])
    assert missing.exit_code == 2 and "Traceback" not in missing.output
