"""Signed checkpoints, Run exports with inclusion proofs, and the standalone verifier (SPEC A3b)."""

from __future__ import annotations

import base64
import copy
import json
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit import formats, standalone
from harness.audit.checkpoint import TamperedHistoryError, build_tree, publish_checkpoint
from harness.audit.checkpoint_files import list_checkpoints, public_key
from harness.audit.export import export_run
from harness.audit.formats import signed_message
from harness.audit.keys import KEY_ENV, CheckpointError, default_key_path
from harness.audit.standalone import verify_consistency, verify_export, verify_sequence
from harness.domain.chain import record_hash
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState
from tests.integration.test_tamper import rebuild_chain

S = RunState


def drive(machine: StateMachine, path: Sequence[RunState]) -> str:
    """Create a Run and move it along `path` (the machine funnels transient states to a final one)."""
    run, _ = cast(SqlStore, machine.store).create_run(NewRun("acme", "ana", "s1", {"task": "t"}))
    state = S.CREATED
    for target in path:
        machine.transition(run.run_id, state, target, actor="test", reason=f"to {target}")
        state = target
    return run.run_id


SUCCESS = (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING)


@pytest.fixture
def cpdir(tmp_path: Path) -> Path:
    """Where checkpoints are published."""
    return tmp_path / "checkpoints"


@pytest.fixture
def run_id(machine: StateMachine) -> str:
    """A succeeded Run surrounded by other Runs' records."""
    drive(machine, (S.PREPARING, S.FAILED))
    target = drive(machine, SUCCESS)
    drive(machine, (S.PREPARING, S.PLANNING, S.CANCELLED))
    return target


def resign(doc: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """Sign a (forged) tree head with `key`, as an attacker holding the key would."""
    doc["signature"] = base64.b64encode(key.sign(signed_message(doc))).decode()
    return doc


def key_of(store: SqlStore) -> Ed25519PrivateKey:
    """The database's private signing key (in the key folder, not beside the checkpoints)."""
    loaded = serialization.load_pem_private_key(default_key_path(store.database_id()).read_bytes(), None)
    assert isinstance(loaded, Ed25519PrivateKey)
    return loaded


def test_an_export_verifies_standalone(store: SqlStore, run_id: str, cpdir: Path) -> None:
    """Every record of an exported Run is proven in the signed tree head, with no database at hand."""
    cp = publish_checkpoint(SqlAuditReads(store), cpdir)
    export = export_run(SqlAuditReads(store), run_id, cp)
    assert export["complete"] and len(export["records"]) == len(store.trace_of(run_id)) > 7
    result = verify_export(json.loads(json.dumps(export)), json.loads(cp.path.read_text()), public_key(cpdir))
    assert result.ok, result.failures
    assert result.checked == len(export["records"]) and not result.notes


def test_the_standalone_verifier_touches_no_database() -> None:
    """Importing the standalone verifier loads neither SQLAlchemy nor the store."""
    code = ("import sys, harness.audit.standalone; "
            "bad = [m for m in sys.modules if m.startswith(('sqlalchemy', 'harness.adapters'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def forgeries(export: dict[str, Any], cp: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each forged (export, checkpoint) pair, by name."""
    out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}

    def forge(name: str, change: Any) -> None:
        e, c = copy.deepcopy(export), copy.deepcopy(cp)
        change(e, c)
        out[name] = (e, c)

    def swap_sibling(e: dict[str, Any], c: dict[str, Any]) -> None:
        proof = e["records"][2]["inclusion_proof"]
        proof[0], proof[1] = proof[1], proof[0]

    def swap_proofs(e: dict[str, Any], c: dict[str, Any]) -> None:
        r0, r1 = e["records"][0], e["records"][1]
        r0["inclusion_proof"], r1["inclusion_proof"] = r1["inclusion_proof"], r0["inclusion_proof"]

    def move(e: dict[str, Any], c: dict[str, Any]) -> None:
        # claim another position, with the record's chain hash recomputed to match it
        r = e["records"][1]
        r["seq"] += 1
        r["leaf_index"] += 1
        fields = ("seq", "record_id", "run_id", "kind", "prev_hash", "payload")
        r["hash"] = record_hash(*(r[f] for f in fields))

    forge("wrong index", lambda e, c: e["records"][1].update(leaf_index=e["records"][1]["leaf_index"] + 1))
    forge("moved to another index", move)
    forge("wrong seq", lambda e, c: e["records"][1].update(seq=e["records"][1]["seq"] + 1))
    forge("swapped sibling", swap_sibling)
    forge("proofs of another record", swap_proofs)
    forge("truncated proof", lambda e, c: e["records"][0]["inclusion_proof"].pop())
    forge("edited payload", lambda e, c: e["records"][0].update(payload=e["records"][0]["payload"] + " "))
    forge("altered root", lambda e, c: (c.update(root_hash="0" * 64),
                                        e["checkpoint"].update(root_hash="0" * 64)))
    forge("wrong tree size", lambda e, c: (c.update(tree_size=c["tree_size"] + 1),
                                           e["checkpoint"].update(tree_size=c["tree_size"])))
    forge("bad signature", lambda e, c: c.update(signature=c["signature"][:-4] + "AAA="))
    forge("other checkpoint", lambda e, c: e["checkpoint"].update(tree_size=3))
    forge("withheld transition", lambda e, c: e["records"].pop(
        next(i for i, r in enumerate(e["records"]) if r["kind"] == "transition" and i > 0)))
    forge("record of another run", lambda e, c: e.update(run_id="someone-else"))
    return out


@pytest.mark.parametrize(("name", "reason"), [
    ("wrong index", "leaf_index"),
    ("moved to another index", "inclusion proof"),
    ("wrong seq", "edited"),
    ("swapped sibling", "inclusion proof"),
    ("proofs of another record", "inclusion proof"),
    ("truncated proof", "inclusion proof"),
    ("edited payload", "edited"),
    ("altered root", "signature is invalid"),
    ("wrong tree size", "signature is invalid"),
    ("bad signature", "signature is invalid"),
    ("other checkpoint", "made against tree size"),
    ("withheld transition", "withheld"),
    ("record of another run", "belongs to run"),
])
def test_forged_exports_are_rejected(store: SqlStore, run_id: str, cpdir: Path, name: str, reason: str,
                                     ) -> None:
    """Each forgery of the proofs, the records or the signed head is rejected, naming why."""
    cp = publish_checkpoint(SqlAuditReads(store), cpdir)
    forged_export, forged_cp = forgeries(export_run(SqlAuditReads(store), run_id, cp), cp.doc)[name]
    result = verify_export(forged_export, forged_cp, public_key(cpdir))
    assert not result.ok and reason in result.failures[0]


def test_a_checkpoint_signed_by_another_key_is_rejected(store: SqlStore, run_id: str, cpdir: Path) -> None:
    """A valid signature under a key other than the trusted one does not count."""
    cp = publish_checkpoint(SqlAuditReads(store), cpdir)
    other = Ed25519PrivateKey.generate()
    result = verify_export(export_run(SqlAuditReads(store), run_id, cp), cp.doc, other.public_key())
    assert not result.ok and "key" in result.failures[0]


def test_records_newer_than_the_checkpoint_are_listed_not_covered(
    store: SqlStore, machine: StateMachine, cpdir: Path
) -> None:
    """An export against an older checkpoint proves what it can and says what it cannot."""
    rid = drive(machine, (S.PREPARING, S.PLANNING))
    cp = publish_checkpoint(SqlAuditReads(store), cpdir)
    machine.transition(rid, S.PLANNING, S.CANCELLED, actor="test", reason="stop")
    export = export_run(SqlAuditReads(store), rid, cp)
    assert not export["complete"] and export["not_covered"]
    result = verify_export(export, cp.doc, public_key(cpdir))
    assert not result.ok and "RunTrace is newer than the checkpoint" in result.failures[0]
    result = verify_export(export, cp.doc, public_key(cpdir), allow_incomplete=True)
    assert result.ok and result.complete is False
    assert any("newer than the checkpoint" in n for n in result.notes)
    fresh = publish_checkpoint(SqlAuditReads(store), cpdir)
    assert export_run(SqlAuditReads(store), rid, fresh)["complete"]


def test_consecutive_checkpoints_are_consistent(store: SqlStore, machine: StateMachine, cpdir: Path) -> None:
    """Each checkpoint embeds a consistency proof from the one before, and the chain of them verifies."""
    docs = []
    for _ in range(3):
        drive(machine, SUCCESS)
        docs.append(publish_checkpoint(SqlAuditReads(store), cpdir).doc)
    key = public_key(cpdir)
    assert verify_consistency(docs[0], docs[1], key).ok
    assert verify_sequence(docs, key).ok
    assert not verify_consistency(docs[0], docs[2], key).ok  # no embedded proof: give the one between
    tree = build_tree(SqlAuditReads(store), docs[2]["tree_size"])
    assert verify_consistency(docs[0], docs[2], key, tree.consistency_proof(docs[0]["tree_size"])).ok
    assert not verify_consistency(docs[1], docs[0], key).ok


def test_consistency_fails_for_a_rewritten_history(store: SqlStore, machine: StateMachine, cpdir: Path,
                                                   tmp_path: Path) -> None:
    """A newer head signed over a different history (same key) fails the proof from the older head."""
    drive(machine, SUCCESS)
    old = publish_checkpoint(SqlAuditReads(store), cpdir).doc
    other = SqlStore.open(str(tmp_path / "other.db"), store.clock)
    other_machine = StateMachine(other)
    drive(other_machine, SUCCESS)
    drive(other_machine, SUCCESS)
    tree = build_tree(SqlAuditReads(other), other.chain_head()[0])
    new = resign({**old, "tree_size": tree.size, "root_hash": tree.root().hex(),
                  "chain_head_hash": other.chain_head()[1]}, key_of(store))
    result = verify_consistency(old, new, public_key(cpdir), tree.consistency_proof(old["tree_size"]))
    assert not result.ok and "rewritten" in result.failures[0]
    other.close()


def test_publishing_over_a_rewritten_history_is_refused(store: SqlStore, run_id: str, cpdir: Path) -> None:
    """The publisher will not sign a database whose history no longer matches its last checkpoint."""
    publish_checkpoint(SqlAuditReads(store), cpdir)
    rebuild_chain(store, keep=lambda r: True, payload=lambda r: r.payload.replace("to ", "TO "))
    with pytest.raises(TamperedHistoryError, match="differ from checkpoint-00000001"):
        publish_checkpoint(SqlAuditReads(store), cpdir)
    assert len(list_checkpoints(cpdir)) == 1


def test_checkpoints_are_immutable_and_the_key_private(store: SqlStore, run_id: str, cpdir: Path) -> None:
    """Checkpoints are numbered new files, read-only; the generated private key is mode 0600, in a folder
    of mode 0700 apart from the checkpoints."""
    first, second = publish_checkpoint(SqlAuditReads(store), cpdir), publish_checkpoint(SqlAuditReads(store), cpdir)
    assert (first.serial, second.serial) == (1, 2) and second.doc["previous"]["file"] == first.path.name
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o444
    key = default_key_path(store.database_id())
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and not list(cpdir.glob("*key.pem"))[1:]
    assert {p.name for p in cpdir.iterdir()} == {"checkpoint-00000001.json", "checkpoint-00000002.json",
                                                 "public-key.pem", "public-keys"}
    (cpdir / "checkpoint-00000003.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"checkpoint-00000003\.json"):
        publish_checkpoint(SqlAuditReads(store), cpdir)


def test_a_configured_key_is_used_and_must_be_private(
    store: SqlStore, run_id: str, cpdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HARNESS_CHECKPOINT_KEY names the signing key; a key readable by others is refused."""
    key = Ed25519PrivateKey.generate()
    path = tmp_path / "signing.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(path, 0o644)
    monkeypatch.setenv(KEY_ENV, str(path))
    with pytest.raises(CheckpointError, match="readable by other users"):
        publish_checkpoint(SqlAuditReads(store), cpdir)
    os.chmod(path, 0o600)
    cp = publish_checkpoint(SqlAuditReads(store), cpdir)
    assert cp.doc["key_id"] == formats.key_id_of(key.public_key())
    assert not (cpdir / "checkpoint-key.pem").exists()


def write(path: Path, doc: Any) -> str:
    """Write a JSON file; return its path as a string."""
    path.write_text(json.dumps(doc))
    return str(path)


def test_harness_verify_command_line(store: SqlStore, run_id: str, cpdir: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """harness-verify exits 0 for a valid export or sequence, 1 for a forged one, 2 for bad input."""
    first = publish_checkpoint(SqlAuditReads(store), cpdir)
    second = publish_checkpoint(SqlAuditReads(store), cpdir)
    good = write(tmp_path / "export.json", export_run(SqlAuditReads(store), run_id, second))
    cps = [str(first.path), str(second.path)]
    assert standalone.main(["export", good, "--checkpoint", str(second.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert standalone.main(["consistency", *cps, "--public-key", str(cpdir / "public-key.pem")]) == 0
    forged = forgeries(json.loads(Path(good).read_text()), second.doc)["swapped sibling"][0]
    assert standalone.main(["export", write(tmp_path / "f.json", forged), "--checkpoint", cps[1]]) == 1
    assert "FAIL" in capsys.readouterr().out
    (tmp_path / "junk.json").write_text("{not json")
    assert standalone.main(["export", str(tmp_path / "junk.json"), "--checkpoint", cps[1]]) == 2
    assert standalone.main(["consistency", cps[0]]) == 2
    malformed = write(tmp_path / "cp.json", {"format": "x"})
    assert standalone.main(["export", good, "--checkpoint", malformed]) == 2
    assert "error:" in capsys.readouterr().err


def test_harness_verify_runs_as_a_module(store: SqlStore, run_id: str, cpdir: Path, tmp_path: Path) -> None:
    """`python -m harness.audit.standalone` is the console script, with its exit codes."""
    cp = publish_checkpoint(SqlAuditReads(store), cpdir)
    good = write(tmp_path / "export.json", export_run(SqlAuditReads(store), run_id, cp))
    args = [sys.executable, "-m", "harness.audit.standalone", "export", good, "--checkpoint", str(cp.path)]
    done = subprocess.run([*args, "--json"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and json.loads(done.stdout)["ok"]
    done = subprocess.run([*args[:4], "missing.json", *args[5:]], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
