"""The audit tools on tampered input: a report and exit 1 (or exit 2 for a malformed document), never a
traceback; with --json one JSON document whose `ok` agrees with the exit code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.adapters.sql.store import SqlStore
from harness.audit import standalone
from harness.drive.state_machine import StateMachine
from tests.acceptance.test_cli_audit import audit, doc
from tests.integration.bulk_runs import drive

FIRST = "checkpoint-00000001.json"


@pytest.fixture
def db(db_path: Path, store: SqlStore, machine: StateMachine) -> str:
    """A database with one succeeded Run, as a --db argument."""
    drive(machine)
    store.drain_all()
    return str(db_path)


@pytest.fixture
def cpdir(db: str, tmp_path: Path) -> Path:
    """A checkpoint folder holding one checkpoint of the database."""
    folder = tmp_path / "cps"
    assert audit("checkpoint", "--db", db, "--dir", str(folder)).exit_code == 0
    return folder


def rewrite(path: Path, change: dict[str, Any]) -> None:
    """Overwrite fields of a (read-only) checkpoint or export file."""
    document = json.loads(path.read_text())
    document.update(change)
    path.chmod(0o644)
    path.write_text(json.dumps(document))


def run_verify(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """harness-verify ARGV in-process: (exit code, stdout, stderr)."""
    code = standalone.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


WRONG_TYPES = [{"tree_size": "zz"}, {"tree_size": None}, {"tree_size": [1]}, {"format": [1]}, {"format": {}},
               {"timestamp": "now"}, {"root_hash": 7}, {"database_id": ["x"]}, {"leaves": {"start": "0"}}]


@pytest.mark.parametrize("change", WRONG_TYPES, ids=json.dumps)
def test_verify_reports_a_checkpoint_field_of_the_wrong_type(db: str, cpdir: Path, change: dict[str, Any]) -> None:
    """A checkpoint file with a field of the wrong type is a checkpoint_invalid problem: exit 1, JSON report."""
    rewrite(cpdir / FIRST, change)
    result = audit("verify", "--db", db, "--checkpoint-dir", str(cpdir), "--json")
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    report = doc(result)
    assert report["ok"] is False
    assert report["first_bad"]["kind"] == "checkpoint_invalid" and FIRST in report["first_bad"]["detail"]


@pytest.mark.parametrize("change", WRONG_TYPES, ids=json.dumps)
def test_consistency_refuses_a_checkpoint_field_of_the_wrong_type(
    cpdir: Path, tmp_path: Path, change: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """harness-verify consistency names the malformed file and field of a checkpoint (exit 2), with no
    traceback."""
    tampered = tmp_path / "tampered.json"
    tampered.write_text((cpdir / FIRST).read_text())
    rewrite(tampered, change)
    code, out, err = run_verify(["consistency", str(cpdir / FIRST), str(tampered), "--public-key",
                                 str(cpdir / "public-key.pem"), "--json"], capsys)
    assert code == 2 and err.startswith(f"error: {tampered}: ") and out == ""


@pytest.fixture
def exported(db: str, store: SqlStore, cpdir: Path, tmp_path: Path) -> Path:
    """An export of the database's Run, made against the checkpoint in `cpdir`."""
    out = tmp_path / "run.json"
    assert audit("export", store.list_runs()[0].run_id, "--db", db, "--dir", str(cpdir), "-o", str(out)).exit_code == 0
    return out


@pytest.mark.parametrize("field", ["kind", "payload", "prev_hash", "record_id", "run_id"])
@pytest.mark.parametrize("value", [None, 5, [1], {"a": 1}])
def test_export_names_a_record_field_of_the_wrong_type(
    exported: Path, cpdir: Path, field: str, value: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record field that must be a string and is not is named, records[i].FIELD, with exit 2."""
    document = json.loads(exported.read_text())
    document["records"][0][field] = value
    exported.write_text(json.dumps(document))
    code, out, err = run_verify(["export", str(exported), "--checkpoint", str(cpdir)], capsys)
    assert code == 2, out + err
    assert err == f"error: records[0].{field} must be a string\n"


@pytest.mark.parametrize("value", [5, "zz", {"a": 1}])
def test_export_refuses_a_not_covered_that_is_not_a_list(
    exported: Path, cpdir: Path, value: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`not_covered` lists records: anything else is a malformed export, not a count of its characters."""
    rewrite(exported, {"not_covered": value})
    code, _, err = run_verify(["export", str(exported), "--checkpoint", str(cpdir)], capsys)
    assert code == 2 and "export.not_covered must be a list" in err


@pytest.mark.parametrize("content", ["[]", "null", "5", '"x"', "{}"])
def test_export_that_is_not_an_export_is_named_so(
    cpdir: Path, tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An export file that is not an export object says so, not that the checkpoint folder cannot be read."""
    path = tmp_path / "m.json"
    path.write_text(content)
    code, out, err = run_verify(["export", str(path), "--checkpoint", str(cpdir)], capsys)
    assert code == 2 and out == ""
    assert err == "error: an export must be a JSON object with format 'harness-export/1'\n"


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_verify_fails_when_the_witness_cannot_be_read(db: str, cpdir: Path, tmp_path: Path, kind: str) -> None:
    """A witness path that does not exist, or is a file, fails the check (exit 1) and says why."""
    witness = tmp_path / "notaurl"
    if kind == "file":
        witness.write_text("not a witness")
    result = audit("verify", "--db", db, "--checkpoint-dir", str(cpdir), "--witness", str(witness), "--json")
    assert result.exit_code == 1, result.output
    report = doc(result)
    assert report["ok"] is False
    assert report["first_bad"]["kind"] == "witness_unreadable" and str(witness) in report["first_bad"]["detail"]


def test_verify_warns_when_the_witness_lacks_local_checkpoints(db: str, cpdir: Path, tmp_path: Path) -> None:
    """A witness that holds none of the database's checkpoints while the local folder does is said."""
    witness = tmp_path / "witness"
    witness.mkdir()
    result = audit("verify", "--db", db, "--checkpoint-dir", str(cpdir), "--witness", str(witness), "--json")
    assert result.exit_code == 0, result.output
    assert any(f"witness {witness} holds no checkpoint of this database" in w for w in doc(result)["warnings"])


def test_verify_reports_a_witness_file_that_is_not_json(db: str, cpdir: Path, tmp_path: Path, store: SqlStore) -> None:
    """A witness copy that is not JSON fails the check as an unreadable witness, with no traceback."""
    witness = tmp_path / "witness"
    assert audit("checkpoint", "--db", db, "--dir", str(tmp_path / "other"), "--witness", str(witness)).exit_code == 0
    copy = witness / str(store.database_id()) / FIRST
    copy.chmod(0o644)
    copy.write_text("{not json")
    result = audit("verify", "--db", db, "--checkpoint-dir", str(cpdir), "--witness", str(witness), "--json")
    assert result.exit_code == 1, result.output
    assert doc(result)["first_bad"]["kind"] == "witness_unreadable"


def test_require_checkpoint_reports_ok_false(db: str, tmp_path: Path) -> None:
    """With --require-checkpoint and nothing to check against, the JSON's ok agrees with exit 1."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = audit("verify", "--db", db, "--checkpoint-dir", str(empty), "--require-checkpoint", "--json")
    assert result.exit_code == 1, result.output
    report = doc(result)
    assert report["ok"] is False and report["first_bad"]["kind"] == "checkpoint_missing"
