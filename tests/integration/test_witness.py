"""Checkpoint witnesses (SPEC A3b): `harness witness serve` on loopback keeps checkpoints append-only and
refuses what does not extend them (stale, forked, rewritten), what its trusted key did not sign, and
submissions without its token; publishers racing in two processes leave it one consistent history."""

from __future__ import annotations

import base64
import copy
import json
import multiprocessing as mp
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit.checkpoint import TamperedHistoryError, build_tree, publish_checkpoint
from harness.audit.checkpoint_files import public_pem
from harness.audit.formats import key_id_of, signed_message
from harness.audit.verify import verify_chain
from harness.audit.witness import DirectoryWitness, HttpWitness, WitnessError, WitnessRefusedError
from harness.clock import FakeClock
from harness.domain.outbound import OutboundGuard, OutboundRule
from harness.settings import Settings

from . import witness_child
from .test_checkpoint_export import key_of
from .test_checkpoint_trust import audit, rewrite, runs_with_steps, step_seq

TOKEN = "witness-test-token"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def witness_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `harness witness serve` process on a loopback port, requiring a bearer token (one for the
    module: each test's database has its own id, so they never meet in it)."""
    port = _free_port()
    env = {**os.environ, "HARNESS_WITNESS_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "witness", "serve", "--dir",
                             str(tmp_path_factory.mktemp("witness")), "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the witness did not start"
        time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(autouse=True)
def _loopback_witness_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's opt-in for a witness on this machine: without it a loopback witness URL is refused."""
    monkeypatch.setenv("HARNESS_WITNESS_ALLOW_INTERNAL", "127.0.0.1")


def _resigned(doc: dict[str, Any], key: Ed25519PrivateKey, **changes: Any) -> dict[str, Any]:
    forged = {**copy.deepcopy(doc), **changes, "key_id": key_id_of(key.public_key())}
    forged["signature"] = base64.b64encode(key.sign(signed_message(forged))).decode()
    return forged


def test_an_http_witness_keeps_consistent_checkpoints_and_refuses_the_rest(store: SqlStore, tmp_path: Path,
                                                                           witness_url: str) -> None:
    """Published checkpoints are kept (the second with a consistency proof from the first); the same head
    again is a duplicate; a stale one, another key's, one without the token, one of another database and a
    forked head are refused with their status; verify against the witness passes."""
    witness, cpdir = HttpWitness(witness_url, token=TOKEN), tmp_path / "cps"
    runs_with_steps(store, 1)
    first = publish_checkpoint(SqlAuditReads(store), cpdir, witnesses=[witness])
    runs_with_steps(store, 1)
    second = publish_checkpoint(SqlAuditReads(store), cpdir, witnesses=[witness])
    assert first.witnessed == second.witnessed == ((witness.name, None),)
    db = store.database_id()
    kept = witness.checkpoints(db)
    assert [d["tree_size"] for d in kept] == [first.tree_size, second.tree_size]
    assert witness.public_key(db) is not None and witness.latest(db) == second.doc
    pem = public_pem(witness.public_key(db)).decode()  # type: ignore[arg-type]
    tree = build_tree(SqlAuditReads(store), second.tree_size)

    def proof(size: int, to: int) -> dict[str, Any]:
        return {"tree_size": size, "root_hash": tree.root(size).hex(),
                "proof": [p.hex() for p in tree.consistency_proof(size, to)]}

    assert witness.submit(db, second.doc, pem, proof(second.tree_size, second.tree_size)).duplicate
    refusals = {
        "stale": (first.doc, proof(second.tree_size, second.tree_size), 409, "stale"),
        "another key": (_resigned(second.doc, Ed25519PrivateKey.generate()), None, 403, "not a trusted key"),
        "forked": (_resigned(second.doc, key_of(store), root_hash="0" * 64), None, 409, "forked"),
        "other database": ({**second.doc, "database_id": "someone-else"}, None, 422, "database"),
    }
    for name, (doc, given, status, says) in refusals.items():
        with pytest.raises(WitnessRefusedError) as refused:
            witness.submit(db, doc, pem, given)
        assert (refused.value.status, says in str(refused.value)) == (status, True), name
    anonymous = HttpWitness(witness_url, token="")
    with pytest.raises(WitnessError, match="401"):
        anonymous.submit(db, second.doc, pem, None)
    assert len(witness.checkpoints(db)) == 2
    report = verify_chain(SqlAuditReads(store), cpdir, witnesses=[anonymous])  # reads need no token
    assert report.ok and report.checkpoints_checked == 4, report


def test_an_http_witness_refuses_a_rewritten_history_signed_by_the_real_key(store: SqlStore, tmp_path: Path,
                                                                             witness_url: str) -> None:
    """Holding the key does not help a local attacker: a checkpoint over a rewritten chain, with a valid
    signature and a proof from its own forged history, is refused as inconsistent; verify against the
    witness names the rewritten record."""
    witness, cpdir = HttpWitness(witness_url, token=TOKEN), tmp_path / "cps"
    runs = runs_with_steps(store, 2)
    publish_checkpoint(SqlAuditReads(store), cpdir, witnesses=[witness])
    victim = step_seq(store, runs[0])
    rewrite(store, victim)
    with pytest.raises(TamperedHistoryError, match="witness"):
        publish_checkpoint(SqlAuditReads(store), cpdir, witnesses=[witness])
    for path in cpdir.glob("checkpoint-*.json"):
        path.unlink()
    runs_with_steps(store, 1)
    forged = publish_checkpoint(SqlAuditReads(store), cpdir)  # a fresh local history, signed by the real key
    tree = build_tree(SqlAuditReads(store), forged.tree_size)
    old = witness.latest(store.database_id())
    assert old is not None
    size = int(old["tree_size"])
    claimed = {"tree_size": size, "root_hash": old["root_hash"],
               "proof": [p.hex() for p in tree.consistency_proof(size, forged.tree_size)]}
    with pytest.raises(WitnessRefusedError, match="inconsistent") as refused:
        witness.submit(store.database_id(), forged.doc, None, claimed)
    assert refused.value.status == 409
    found = verify_chain(SqlAuditReads(store), cpdir, witnesses=[witness]).problems
    mismatch = [p for p in found if p.kind == "checkpoint_mismatch"]
    assert mismatch and mismatch[0].seq == victim


def test_publishers_racing_leave_the_witness_one_consistent_history(backend_url: str, tmp_path: Path) -> None:
    """Two processes publishing at once to one directory witness: none is refused, and every checkpoint
    the witness keeps is a tree head of the one chain, in growing order."""
    SqlStore.open(backend_url, FakeClock()).close()  # migrated before the race
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    outs = [tmp_path / f"out-{i}.txt" for i in range(2)]
    procs = [ctx.Process(target=witness_child.publisher,
                         args=(backend_url, str(tmp_path / "witness"), str(tmp_path / f"local-{i}"), barrier, str(out)))
             for i, out in enumerate(outs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert all(o.read_text().endswith("None),)") for o in outs), [o.read_text() for o in outs]
    store = SqlStore.open(backend_url, FakeClock())
    try:
        kept = DirectoryWitness(tmp_path / "witness").checkpoints(store.database_id())
        tree = build_tree(SqlAuditReads(store), store.chain_head()[0])
        sizes = [int(d["tree_size"]) for d in kept]
        assert kept and sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
        assert all(tree.root(int(d["tree_size"])).hex() == d["root_hash"] for d in kept)
        assert verify_chain(SqlAuditReads(store), witnesses=[DirectoryWitness(tmp_path / "witness")]).ok
    finally:
        store.close()


def _grow(db: Path, runs: int) -> None:
    store = SqlStore.open(str(db), FakeClock())
    try:
        runs_with_steps(store, runs)
    finally:
        store.close()


def _copy_db(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite database (as a backup, a snapshot or a forked copy is)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    dst.close()
    src.close()


def _checkpoint(db: Path, cpdir: Path, url: str) -> Any:
    return audit("checkpoint", "--db", str(db), "--dir", str(cpdir), "--witness", url, "--json")


def _verify_kinds(db: Path, cpdir: Path, url: str) -> tuple[int, list[str], str]:
    result = audit("verify", "--db", str(db), "--checkpoint-dir", str(cpdir), "--witness", url, "--json")
    problems = json.loads(result.stdout)["problems"]
    return result.exit_code, [p["kind"] for p in problems], " ".join(p["detail"] for p in problems)


def test_a_forked_copy_that_published_first_is_reported_as_a_fork(tmp_path: Path, witness_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the database grows further and publishes first: the original's next checkpoint is not
    called kept (its history is no prefix of the witness's), the fork is named and the command exits 1;
    verify against the witness names a fork, not deleted records."""
    monkeypatch.setenv("HARNESS_WITNESS_TOKEN", TOKEN)
    original, copy_, here, there = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "cps-a", tmp_path / "cps-b"
    _grow(original, 1)
    assert _checkpoint(original, here, witness_url).exit_code == 0
    _copy_db(original, copy_)
    shutil.copytree(here, there)
    _grow(copy_, 2)
    published = _checkpoint(copy_, there, witness_url)
    assert published.exit_code == 0 and json.loads(published.stdout)["witnesses"][0]["ok"], published.output
    _grow(original, 1)
    refused = _checkpoint(original, here, witness_url)
    assert refused.exit_code == 1, refused.output
    assert "fork" in refused.output and '"ok": true' not in refused.output, refused.output
    code, kinds, details = _verify_kinds(original, here, witness_url)
    assert code == 1 and "forked" in kinds and "deleted" not in kinds, (kinds, details)


def test_a_restored_snapshot_is_reported_as_a_rollback(tmp_path: Path, witness_url: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The database and its checkpoint folder restored from a snapshot older than what the witness keeps:
    the next checkpoint is refused as a rollback (exit 1); once the restored database has gone on with
    other records, as a fork."""
    monkeypatch.setenv("HARNESS_WITNESS_TOKEN", TOKEN)
    db, cpdir, snapshot, snapshot_dir = tmp_path / "a.db", tmp_path / "cps", tmp_path / "snap.db", tmp_path / "snap"
    _grow(db, 2)
    assert _checkpoint(db, cpdir, witness_url).exit_code == 0
    _copy_db(db, snapshot)
    shutil.copytree(cpdir, snapshot_dir)
    _grow(db, 2)
    assert _checkpoint(db, cpdir, witness_url).exit_code == 0
    _copy_db(snapshot, db)
    shutil.rmtree(cpdir)
    shutil.copytree(snapshot_dir, cpdir)
    rolled_back = _checkpoint(db, cpdir, witness_url)
    assert rolled_back.exit_code == 1 and "rolled back" in rolled_back.output, rolled_back.output
    code, kinds, _ = _verify_kinds(db, cpdir, witness_url)
    assert code == 1 and kinds == ["deleted"], kinds
    _grow(db, 1)
    forked = _checkpoint(db, cpdir, witness_url)
    assert forked.exit_code == 1 and "fork" in forked.output, forked.output
    code, kinds, _ = _verify_kinds(db, cpdir, witness_url)
    assert code == 1 and "forked" in kinds, kinds


def test_an_http_witness_connects_only_to_the_address_it_checked(store: SqlStore, tmp_path: Path,
                                                                  witness_url: str) -> None:
    """The witness's host is resolved and checked at every request, and the request goes to that address
    (the URL's name kept as Host): a name that resolved to a public address when the settings were read and
    to loopback when the checkpoint is sent (DNS rebinding) is not contacted; a name the operator allows
    reaches the real witness through the address it was checked at."""
    port = int(witness_url.rsplit(":", 1)[1])
    url = f"http://witness.test:{port}"
    answers = [["93.184.216.34"]]  # the first answer; every later one is loopback

    def rebinding(host: str) -> list[str]:
        return answers.pop() if answers else ["127.0.0.1"]

    settings = Settings(checkpoint_witnesses=(url,))
    settings.check_witnesses(resolve=rebinding)  # public when checked: accepted
    rebound = HttpWitness(url, token=TOKEN, rule=settings.witness_rule(), guard=OutboundGuard(rebinding))
    runs_with_steps(store, 1)
    cp = publish_checkpoint(SqlAuditReads(store), tmp_path / "cps", witnesses=[rebound])
    [(name, error)] = cp.witnessed
    assert name == url and error is not None and "not contacted" in error and "127.0.0.1" in error
    with pytest.raises(WitnessError, match="not contacted"):
        rebound.checkpoints(store.database_id())

    allowed = HttpWitness(url, token=TOKEN, rule=OutboundRule.parse(["witness.test"]),
                          guard=OutboundGuard(lambda host: ["127.0.0.1"]))
    assert allowed.checkpoints(store.database_id()) == []  # nothing reached the witness before
    runs_with_steps(store, 1)
    kept = publish_checkpoint(SqlAuditReads(store), tmp_path / "cps", witnesses=[allowed])
    assert kept.witnessed == ((url, None),)
    assert [d["tree_size"] for d in allowed.checkpoints(store.database_id())] == [kept.tree_size]
