"""An export proves it holds every record of its Run (SPEC A1, A3b): the RunTrace names each record the
Run had when it closed, so `harness-verify` refuses an export with a record withheld or cut short before
the close, naming what is missing, and says so loudly of a Run whose completeness it cannot prove."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit import standalone
from harness.audit.checkpoint import publish_checkpoint
from harness.audit.checkpoint_files import public_key
from harness.audit.export import export_run
from harness.audit.standalone import verify_export
from harness.config import Runtime
from harness.domain.errors import CancelRefusedError
from harness.domain.records import TraceRecordIn
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState as S

from .test_checkpoint_export import SUCCESS, drive

TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


@pytest.fixture
def cpdir(tmp_path: Path) -> Path:
    """Where checkpoints are published."""
    return tmp_path / "checkpoints"


def exported(rt: Runtime, run_id: str, cpdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(export, checkpoint document) of a Run, after a fresh checkpoint."""
    cp = publish_checkpoint(SqlAuditReads(rt.store), cpdir)
    return export_run(SqlAuditReads(rt.store), run_id, cp), cp.doc


def without(export: dict[str, Any], keep: Any) -> dict[str, Any]:
    """The export with only the records `keep` accepts."""
    forged = copy.deepcopy(export)
    forged["records"] = [r for r in forged["records"] if keep(r)]
    return forged


def test_a_complete_export_is_proven_complete(test_runtime: Runtime, cpdir: Path) -> None:
    """Every record the RunTrace names is in the export: VALID, complete, nothing noted."""
    run_id = test_runtime.runs.create_run({"task": "echo hello", **TESTER}).run_id
    export, cp = exported(test_runtime, run_id, cpdir)
    result = verify_export(export, cp, public_key(cpdir))
    assert result.ok and result.complete and not result.notes, result


def test_a_withheld_tool_record_is_refused_and_named(test_runtime: Runtime, cpdir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """An export without the Run's tool call (every other record proven) fails, naming the tool record."""
    run_id = test_runtime.runs.create_run({"task": "echo hello", **TESTER}).run_id
    export, cp = exported(test_runtime, run_id, cpdir)
    tool = next(r for r in export["records"] if r["kind"] == "tool")
    result = verify_export(without(export, lambda r: r is not tool and r["record_id"] != tool["record_id"]),
                           cp, public_key(cpdir))
    assert not result.ok
    assert "records withheld" in result.failures[0] and f"tool record {tool['record_id']}" in result.failures[0]
    path = tmp_path / "withheld.json"
    path.write_text(json.dumps(without(export, lambda r: r["record_id"] != tool["record_id"])))
    cp_path = str(sorted(cpdir.glob("checkpoint-*.json"))[-1])
    assert standalone.main(["export", str(path), "--checkpoint", cp_path]) == 1
    assert "1 tool" in capsys.readouterr().out


@pytest.mark.parametrize("cut", ["before the final transition", "before the RunTrace"])
def test_an_export_cut_short_before_the_close_is_refused(test_runtime: Runtime, cpdir: Path, cut: str) -> None:
    """Dropping the closing records (the final transition and everything after, or only the RunTrace and
    after) leaves no RunTrace: the export is refused, saying it ends before the Run's close."""
    run_id = test_runtime.runs.create_run({"task": "echo hello", **TESTER}).run_id
    export, cp = exported(test_runtime, run_id, cpdir)
    records = export["records"]
    trace_at = next(i for i, r in enumerate(records) if r["kind"] == "run")
    final_at = max(i for i, r in enumerate(records[:trace_at]) if r["kind"] == "transition")
    forged = copy.deepcopy(export)
    forged["records"] = records[:final_at if cut == "before the final transition" else trace_at]
    result = verify_export(forged, cp, public_key(cpdir))
    assert not result.ok and "holds no RunTrace" in result.failures[0]
    assert verify_export(forged, cp, public_key(cpdir), allow_incomplete=True).complete is False


def test_records_written_after_the_close_are_proven_and_noted(test_runtime: Runtime, cpdir: Path) -> None:
    """A late cancel's audit event, written after the RunTrace, is proven and reported as after the close;
    the export is still complete."""
    run_id = test_runtime.runs.create_run({"task": "echo hello", **TESTER}).run_id
    with pytest.raises(CancelRefusedError):  # the Run had already closed; the refused attempt is on record
        test_runtime.runs.cancel(run_id, by="t1/tess")
    export, cp = exported(test_runtime, run_id, cpdir)
    result = verify_export(export, cp, public_key(cpdir))
    assert result.ok and result.complete
    assert any("written after its close" in n and "1 audit" in n for n in result.notes), result.notes


def test_a_run_recorded_by_an_earlier_version_is_reported_unproven(
        store: SqlStore, machine: StateMachine, cpdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A RunTrace without a record commitment (written before it existed) cannot prove completeness:
    refused by default, accepted with --allow-incomplete as VALID, COMPLETENESS UNPROVEN — never plain VALID."""
    monkeypatch.setattr(SqlStore, "_with_record_commitment", lambda self, conn, run_id, outbox: outbox)
    run_id = drive(machine, SUCCESS)
    monkeypatch.undo()
    cp = publish_checkpoint(SqlAuditReads(store), cpdir)
    export = export_run(SqlAuditReads(store), run_id, cp)
    result = verify_export(export, cp.doc, public_key(cpdir))
    assert not result.ok and "did not commit to its record count" in result.failures[0]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(export))
    assert standalone.main(["export", str(path), "--checkpoint", str(cp.path)]) == 1
    assert standalone.main(["export", str(path), "--checkpoint", str(cp.path), "--allow-incomplete"]) == 0
    out = capsys.readouterr().out
    assert "VALID, COMPLETENESS UNPROVEN" in out and "did not commit" in out


def test_an_in_flight_run_is_exported_with_a_warning_and_refused(store: SqlStore, machine: StateMachine,
                                                                 cpdir: Path) -> None:
    """A Run that has not closed has no RunTrace yet: its export cannot be proven complete."""
    run_id = drive(machine, (S.PREPARING, S.PLANNING))
    store.record([TraceRecordIn("step", {"n": 1}, run_id)])
    cp = publish_checkpoint(SqlAuditReads(store), cpdir)
    export = export_run(SqlAuditReads(store), run_id, cp)
    assert export["complete"] and not export["closed"]
    result = verify_export(export, cp.doc, public_key(cpdir))
    assert not result.ok and "taken before the Run closed" in result.failures[0]
