"""Checkpoints a local attacker cannot undo (SPEC A3b): the signing key lives apart from the checkpoints, a
witness keeps a second copy that a rewrite and a re-signing cannot match, the first record a rewrite
changed is named, a checkpoint names its database (another database's is reported as such, not as
tampering), the default folder is per database, and having no checkpoint to check against is said loudly."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from harness.adapters.sql import triggers
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.schema import digest_bytes
from harness.adapters.sql.store import SqlStore
from harness.audit import standalone
from harness.audit.checkpoint import TamperedHistoryError, publish_checkpoint
from harness.audit.checkpoint_files import list_checkpoints
from harness.audit.export import export_run
from harness.audit.formats import CHECKPOINT_FORMAT, HEAD_FIELDS, signed_message
from harness.audit.keys import KEY_ENV, CheckpointError, default_key_path
from harness.audit.places import DEFAULT_DIR
from harness.audit.verify import verify_chain
from harness.audit.witness import DirectoryWitness
from harness.cli import app
from harness.clock import FakeClock
from harness.domain.chain import GENESIS_HASH, record_hash
from harness.domain.records import NewRun, TraceRecordIn
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState as S

from .test_checkpoint_export import SUCCESS, drive, key_of
from .test_tamper_rows import drop_append_only


def audit(*args: str) -> Any:
    """`harness audit ARGS`, in-process."""
    return CliRunner().invoke(app, ["audit", *args])


def runs_with_steps(store: SqlStore, count: int) -> list[str]:
    """`count` succeeded Runs, each with a step record (a record no row mirrors), all chained."""
    machine = StateMachine(store)
    made = []
    for _ in range(count):
        run_id = drive(machine, SUCCESS)
        store.record([TraceRecordIn("step", {"note": f"step of {run_id}"}, run_id)])
        made.append(run_id)
    store.drain_all()
    return made


def rewrite(store: SqlStore, seq: int) -> None:
    """Edit record `seq` and recompute the chain and its head after it, on any backend, as an attacker with
    the database's credentials could (the triggers dropped, and restored)."""
    with store.reader.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.text(
            "SELECT seq, record_id, run_id, kind, payload FROM trace_records ORDER BY seq"))]
    target = next(r for r in rows if r["seq"] == seq)
    assert target["kind"] == "step", target
    target["payload"] = target["payload"].replace("step of", "STEP OF")
    prev = GENESIS_HASH
    for r in rows:
        r["prev_hash"], r["hash"] = prev, record_hash(r["seq"], r["record_id"], r["run_id"], r["kind"], prev,
                                                      r["payload"])
        prev = r["hash"]
    dialect = store.engine.dialect.name
    with store.engine.begin() as conn:
        drop_append_only(conn, "trace_records")
        for statement in triggers.drop_linear_chain_ddl(dialect):
            conn.exec_driver_sql(statement)
        conn.execute(sa.text("UPDATE trace_records SET payload = :payload, prev_hash = :prev_hash, hash = :hash "
                             "WHERE seq = :seq"),
                     [{**r, "prev_hash": digest_bytes(r["prev_hash"]), "hash": digest_bytes(r["hash"])}
                      for r in rows if r["seq"] >= seq])
        conn.execute(sa.text("UPDATE chain_head SET hash = :h WHERE id = 1"), {"h": digest_bytes(prev)})


def step_seq(store: SqlStore, run_id: str) -> int:
    """The seq of the Run's step record."""
    return next(r.seq for r in store.trace_of(run_id) if r.kind == "step")


def test_the_signing_key_is_kept_apart_from_the_checkpoints(store: SqlStore, tmp_path: Path) -> None:
    """No private key is written into the checkpoint folder; the database's key is mode 0600 in a 0700
    folder of its own, and a key others may read is refused."""
    runs_with_steps(store, 1)
    cpdir = tmp_path / "cps"
    publish_checkpoint(SqlAuditReads(store), cpdir)
    assert not [p for p in cpdir.rglob("*") if p.is_file() and b"PRIVATE KEY" in p.read_bytes()]
    key = default_key_path(store.database_id())
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    key.chmod(0o640)
    with pytest.raises(CheckpointError, match="readable by other users"):
        publish_checkpoint(SqlAuditReads(store), cpdir)
    key.chmod(0o600)


def test_a_key_left_in_the_checkpoint_folder_is_refused_and_moved(store: SqlStore, db_path: Path,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout of earlier versions (checkpoint-key.pem beside the checkpoints) is refused, naming the
    move; `harness audit move-key` moves it and publishing goes on with the same key; a configured key in
    the checkpoint folder is refused too."""
    runs_with_steps(store, 1)
    cpdir = tmp_path / "cps"
    first = publish_checkpoint(SqlAuditReads(store), cpdir)
    shutil.move(default_key_path(store.database_id()), cpdir / "checkpoint-key.pem")
    with pytest.raises(CheckpointError, match="harness audit move-key"):
        publish_checkpoint(SqlAuditReads(store), cpdir)
    moved = audit("move-key", "--db", str(db_path), "--dir", str(cpdir), "--json")
    assert moved.exit_code == 0, moved.output
    assert json.loads(moved.stdout)["to"] == str(default_key_path(store.database_id()))
    assert not (cpdir / "checkpoint-key.pem").exists()
    second = publish_checkpoint(SqlAuditReads(store), cpdir)
    assert second.doc["key_id"] == first.doc["key_id"] and verify_chain(SqlAuditReads(store), cpdir).ok
    monkeypatch.setenv(KEY_ENV, str(cpdir / "public-keys"))
    with pytest.raises(CheckpointError, match="inside the checkpoint directory"):
        publish_checkpoint(SqlAuditReads(store), cpdir)


def test_a_rewrite_re_signed_locally_is_caught_by_the_witness(backend_url: str, tmp_path: Path) -> None:
    """An attacker who rewrites the chain, deletes the local checkpoints and re-signs (holding the key,
    the worst case) passes a local verify, but not one against the witness, which names the first record
    that differs; and publishing to the witness over the rewritten chain is refused."""
    store = SqlStore.open(backend_url, FakeClock())
    try:
        cpdir, witness = tmp_path / "cps", DirectoryWitness(tmp_path / "witness")
        runs = runs_with_steps(store, 2)
        assert publish_checkpoint(SqlAuditReads(store), cpdir, witnesses=[witness]).witnessed == ((witness.name, None),)
        runs += runs_with_steps(store, 2)
        publish_checkpoint(SqlAuditReads(store), cpdir, witnesses=[witness])
        assert verify_chain(SqlAuditReads(store), cpdir, witnesses=[witness]).ok
        victim = step_seq(store, runs[1])
        rewrite(store, victim)
        for cp in list_checkpoints(cpdir):
            cp.path.unlink()
        publish_checkpoint(SqlAuditReads(store), cpdir)  # re-signed with the real key, over the rewritten chain
        assert verify_chain(SqlAuditReads(store), cpdir).ok  # the local copy alone cannot tell
        report = verify_chain(SqlAuditReads(store), cpdir, witnesses=[witness])
        mismatch = [p for p in report.problems if p.kind == "checkpoint_mismatch"]
        assert mismatch and all(p.seq == victim for p in mismatch), report.problems
        assert f"record {victim} is the first that differs" in mismatch[0].detail
        assert "witness" in mismatch[0].detail
        with pytest.raises(TamperedHistoryError, match="witness"):
            publish_checkpoint(SqlAuditReads(store), cpdir, witnesses=[witness])
    finally:
        store.close()


def test_the_first_differing_record_is_named_per_checkpoint(store: SqlStore, tmp_path: Path) -> None:
    """With two checkpoints, a rewrite inside the second's range leaves the first valid and names the
    record; a rewrite inside the first's range names that record for both."""
    cpdir = tmp_path / "cps"
    early = runs_with_steps(store, 2)
    publish_checkpoint(SqlAuditReads(store), cpdir)
    late = runs_with_steps(store, 2)
    publish_checkpoint(SqlAuditReads(store), cpdir)
    late_seq = step_seq(store, late[0])
    rewrite(store, late_seq)
    problems = [p for p in verify_chain(SqlAuditReads(store), cpdir).problems if p.kind == "checkpoint_mismatch"]
    assert [(p.seq, "checkpoint-00000002.json" in p.detail) for p in problems] == [(late_seq, True)]
    early_seq = step_seq(store, early[0])
    rewrite(store, early_seq)
    problems = [p for p in verify_chain(SqlAuditReads(store), cpdir).problems if p.kind == "checkpoint_mismatch"]
    assert [p.seq for p in problems] == [early_seq, early_seq]


def test_verify_says_loudly_when_it_has_no_checkpoint(store: SqlStore, db_path: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a checkpoint of the database, verify passes with a loud warning (text and JSON), and fails
    with --require-checkpoint; with one in the default folder it is checked and the warning goes."""
    monkeypatch.chdir(tmp_path)
    runs_with_steps(store, 1)
    text = audit("verify", "--db", str(db_path))
    assert text.exit_code == 0 and "WARNING NO CHECKPOINT of this database" in text.stdout
    doc = json.loads(audit("verify", "--db", str(db_path), "--json").stdout)
    assert doc["ok"] and any("NO CHECKPOINT" in w for w in doc["warnings"]) and doc["checkpoints_checked"] == 0
    assert audit("verify", "--db", str(db_path), "--require-checkpoint").exit_code == 1
    published = audit("checkpoint", "--db", str(db_path), "--json")
    assert published.exit_code == 0, published.output
    assert Path(json.loads(published.stdout)["path"]).parent == Path(DEFAULT_DIR) / store.database_id()
    doc = json.loads(audit("verify", "--db", str(db_path), "--json", "--require-checkpoint").stdout)
    assert doc["ok"] and doc["checkpoints_checked"] == 1 and doc["warnings"] == []


def test_a_checkpoint_of_another_database_is_reported_as_such(store: SqlStore, tmp_path: Path) -> None:
    """Verifying against another database's checkpoints finds no tampering and says whose they are;
    publishing into another database's folder is refused."""
    other = SqlStore.open(str(tmp_path / "other.db"), FakeClock())
    try:
        runs_with_steps(other, 3)
        runs_with_steps(store, 1)
        cpdir = tmp_path / "other-cps"
        publish_checkpoint(SqlAuditReads(other), cpdir)
        report = verify_chain(SqlAuditReads(store), cpdir)
        assert report.ok and report.problems == []
        assert any(f"of database {other.database_id()}, not of this database" in w for w in report.warnings)
        assert any("NO CHECKPOINT" in w for w in report.warnings)
        with pytest.raises(CheckpointError, match=f"holds checkpoints of database {other.database_id()}"):
            publish_checkpoint(SqlAuditReads(store), cpdir)
    finally:
        other.close()


def _as_format_1(doc: dict[str, Any], store: SqlStore) -> dict[str, Any]:
    """The checkpoint as an earlier version wrote it: no database id, no leaf prefixes."""
    head = {name: doc[name] for name in HEAD_FIELDS}
    old = {"format": CHECKPOINT_FORMAT, **head, "previous": None}
    old["signature"] = base64.b64encode(key_of(store).sign(signed_message(old))).decode()
    return old


def test_databases_sharing_a_folder_keep_their_checkpoints_apart(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Two databases in one working folder (the README's Use section in a clone, then a test's fresh
    database): each has its own default checkpoint folder, so the fresh one verifies clean; checkpoints
    left by an earlier version in the shared ./harness-checkpoints are said to match, or not, and are
    never taken for tampering."""
    monkeypatch.chdir(tmp_path)
    used, fresh = SqlStore.open("used.db", FakeClock()), SqlStore.open("fresh.db", FakeClock())
    try:
        runs_with_steps(used, 6)
        assert audit("checkpoint", "--db", "used.db").exit_code == 0
        runs_with_steps(fresh, 1)
        result = audit("verify", "--db", "fresh.db", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["problems"] == []
        shared = Path(DEFAULT_DIR)
        cp = list_checkpoints(shared / used.database_id())[0]
        (shared / "checkpoint-00000001.json").write_text(json.dumps(_as_format_1(cp.doc, used)))
        used_doc = json.loads(audit("verify", "--db", "used.db", "--json").stdout)
        fresh_doc = json.loads(audit("verify", "--db", "fresh.db", "--json").stdout)
        assert used_doc["ok"] and fresh_doc["ok"]
        assert any("match this database: move them" in w for w in used_doc["warnings"])
        assert any("do not match this one" in w for w in fresh_doc["warnings"])
    finally:
        used.close()
        fresh.close()


def test_harness_verify_names_the_missing_file(store: SqlStore, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint path that does not exist is named as such (not as a missing public key beside it); a
    folder without a public key is named too; `harness audit export` without a checkpoint says how to get
    one."""
    run_id = runs_with_steps(store, 1)[0]
    cp = publish_checkpoint(SqlAuditReads(store), tmp_path / "cps")
    export = tmp_path / "run.json"
    export.write_text(json.dumps(export_run(SqlAuditReads(store), run_id, cp)))
    assert standalone.main(["export", str(export), "--checkpoint", str(tmp_path / "nope.json")]) == 2
    assert f"checkpoint file {tmp_path / 'nope.json'} does not exist" in capsys.readouterr().err
    alone = tmp_path / "alone.json"
    shutil.copy(cp.path, alone)
    assert standalone.main(["export", str(export), "--checkpoint", str(alone)]) == 2
    assert "public-key.pem does not exist" in capsys.readouterr().err
    result = audit("export", run_id, "--db", str(store.engine.url.database), "--dir", str(tmp_path / "none"))
    assert result.exit_code == 2 and "harness audit checkpoint" in result.stderr


def test_a_run_created_after_a_checkpoint_keeps_verifying(store: SqlStore, tmp_path: Path) -> None:
    """Checkpoints of format 2 sign the leaf prefixes of the records they add; an untouched chain that
    grew after them verifies against every one."""
    cpdir = tmp_path / "cps"
    for _ in range(3):
        runs_with_steps(store, 1)
        publish_checkpoint(SqlAuditReads(store), cpdir)
    store.create_run(NewRun("acme", "ana", "s", {"task": "t"}))
    store.drain_all()
    machine = StateMachine(store)
    drive(machine, (S.PREPARING, S.FAILED))
    report = verify_chain(SqlAuditReads(store), cpdir)
    assert report.ok and report.checkpoints_checked == 3 and not report.warnings, report
    assert os.path.exists(cpdir / "public-key.pem")
