"""The audit tools on tampered input: a report and exit 1 (or exit 2 for a malformed document), never a
traceback; with --json one JSON document whose `ok` agrees with the exit code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from harness.adapters.sql.store import SqlStore
from harness.audit import standalone
from harness.cli import app
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState

S = RunState
FIRST = "checkpoint-00000001.json"


def audit(*args: str) -> Result:
    """Run `harness audit ARGS` in-process."""
    return CliRunner().invoke(app, ["audit", *args])


def doc(result: Result) -> Any:
    """The single JSON document the command printed on stdout."""
    return json.loads(result.stdout)


@pytest.fixture
def db(db_path: Path, store: SqlStore, machine: StateMachine) -> str:
    """A database with one succeeded Run, as a --db argument."""
    run, _ = store.create_run(NewRun("acme", "ana", "s1", {"task": "t"}))
    state = S.CREATED
    for target in (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING):
        machine.transition(run.run_id, state, target, actor="test", reason="go")
        state = target
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
    """harness-verify consistency names the malformed field of a checkpoint (exit 2), with no traceback."""
    tampered = tmp_path / "tampered.json"
    tampered.write_text((cpdir / FIRST).read_text())
    rewrite(tampered, change)
    code, out, err = run_verify(["consistency", str(cpdir / FIRST), str(tampered), "--public-key",
                                 str(cpdir / "public-key.pem"), "--json"], capsys)
    assert code == 2 and err.startswith("error: ") and out == ""
