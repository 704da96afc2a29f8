"""`harness-verify segment` checks a segment's row copies (the Run, its job, transitions, audit events,
costs, approval requests and decisions: what a read-back shows) against the records the segment proves,
so an auditor holding only the segment and a checkpoint gets the read-back's answer to an edited row."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.clock import FakeClock
from harness.config import Runtime
from harness.domain.contracts import CallerIdentity
from harness.retention.archiver import Archiver
from harness.retention.policy import DAY_S, RetentionPolicy
from harness.retention.storage import LocalSegmentStore
from harness.wiring.retention import archive_rows

Line = dict[str, Any]


def _first(line: Line, table: str) -> dict[str, Any]:
    first: dict[str, Any] = line["tables"][table][0]
    return first


#: one edit per row copy a read-back shows; each names the line it changes by what that line holds
EDITS: dict[str, Callable[[Line], None]] = {
    "result": lambda line: line["run"].update(result=json.dumps({"answer": "forged"})),
    "state": lambda line: line["run"].update(state="FAILED"),
    "user": lambda line: line["run"].update(user_id="mallory"),
    "close reason": lambda line: line["run"].update(close_reason="cancelled"),
    "transition actor": lambda line: line["tables"]["transitions"][-1].update(actor="mallory"),
    "audit event actor": lambda line: _first(line, "audit_events").update(actor="mallory"),
    "approver": lambda line: _first(line, "hitl_decisions").update(approver="mallory"),
    "approval status": lambda line: _first(line, "hitl_requests").update(status="rejected"),
    "cost": lambda line: _first(line, "costs").update(usd=123.0),
    "job": lambda line: line["job"].update(status="failed"),
}


@pytest.fixture
def segment(test_runtime: Runtime, clock: FakeClock, tmp_path: Path) -> tuple[Path, Path]:
    """(segment file, its checkpoint) holding a Run that was approved, spent and succeeded."""
    rt = test_runtime
    parked = rt.runs.create_run({"task": "update T-1", "tenant_id": "t1", "user_id": "tess", "roles": ["tester"]})
    assert parked.approval_request_id
    rt.runs.decide(parked.approval_request_id, CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",)),
                   "approve")
    clock.advance(40 * DAY_S)
    report = Archiver(archive_rows(rt.store), LocalSegmentStore(tmp_path / "archive"), tmp_path / "cps",
                      policy=RetentionPolicy(days=30)).run()
    assert report.runs == 1 and report.location and report.checkpoint
    return tmp_path / "archive" / Path(report.location).name, tmp_path / "cps" / report.checkpoint


def _verify(path: Path, checkpoint: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.audit.standalone", "segment", str(path), "--checkpoint",
                           str(checkpoint), "--json"], capture_output=True, text=True, timeout=60, check=False)


def _edited(segment: Path, out: Path, edit: Callable[[Line], None]) -> Path:
    lines = [json.loads(x) for x in gzip.decompress(segment.read_bytes()).decode().splitlines()]
    edit(lines[1])
    out.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode(), mtime=0))
    return out


def test_edited_row_copies_make_a_segment_invalid(segment: tuple[Path, Path], tmp_path: Path) -> None:
    """The untouched segment is VALID; each edit of a row copy (result, state, owner, close reason, a
    transition's or an event's actor, the approver, an approval's status, a cost, the job) is INVALID,
    naming the row and field."""
    path, checkpoint = segment
    untouched = _verify(path, checkpoint)
    assert untouched.returncode == 0, untouched.stdout + untouched.stderr
    lines = [json.loads(x) for x in gzip.decompress(path.read_bytes()).decode().splitlines()]
    tables = lines[1]["tables"]
    assert all(tables[name] for name in ("transitions", "audit_events", "costs", "hitl_requests", "hitl_decisions"))
    missed = []
    for name, edit in EDITS.items():
        done = _verify(_edited(path, tmp_path / "edited.jsonl.gz", edit), checkpoint)
        failures = json.loads(done.stdout)["failures"] if done.stdout else []
        if done.returncode != 1 or not any("rows differ from" in f for f in failures):
            missed.append((name, done.returncode, failures[:1], done.stderr[-300:]))
    assert not missed, missed
