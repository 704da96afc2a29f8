"""Skills are pinned to their code (SPEC T1, amended), and a skill that fails at import is bad input, as an
operator meets both through the `harness` command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from harness.cli import app
from harness.examples.support import EXAMPLE_DIR
from tests.acceptance.api_helpers import REFUND_L3


def harness(*args: str) -> Result:
    """`harness ARGS` in-process; each call builds its runtime (and loads the skills) afresh, as a new
    process does."""
    return CliRunner().invoke(app, list(args))


def doc(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def support_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The support example's skills in a folder the test may edit, its ledger and data in the test folder."""
    root = tmp_path / "support"
    shutil.copytree(EXAMPLE_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("HARNESS_SKILLS_DIRS", str(root / "skills"))
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HARNESS_DATABASE_URL", str(tmp_path / "harness.db"))
    return root


def test_a_skill_edited_while_its_approval_waits_is_refused_not_run(support_copy: Path, tmp_path: Path) -> None:
    """An L3 refund parks; the skill's Python file is edited (the refund would pay 1.0); the lead approves
    from a process that loaded the edited code: the approval is refused before it is recorded (exit 1,
    naming refunds.issue as changed), the Run still waits with its request pending, and no refund reaches
    the ledger. With the code as the Run pinned it, the same approval goes through and pays once."""
    parked = doc(harness("run", REFUND_L3, "--user", "alice", "--json"))
    assert parked["state"] == "AWAITING_HITL" and parked["approval_request_id"]
    code = support_copy / "skills" / "support_skills.py"
    original = code.read_text()
    paid = '"amount": args["amount"],\n             "run_id"'
    edited = original.replace(paid, paid.replace('args["amount"]', "1.0"))
    assert edited != original
    code.write_text(edited)
    refused = harness("approve", parked["approval_request_id"], "--as", "carol", "--reason", "ok", "--json")
    assert refused.exit_code == 1, refused.output
    changed = refused.stderr.split("changed since the Run started: ", 1)[1].split(")", 1)[0]
    assert "refunds.issue" in changed.split(", "), refused.stderr  # every skill of the edited file, in fact
    assert doc(harness("runs", "show", parked["run_id"], "--json"))["state"] == "AWAITING_HITL"
    pending = doc(harness("approvals", "--json"))["pending"]
    assert [p["request_id"] for p in pending] == [parked["approval_request_id"]]
    ledger = tmp_path / "ledger.jsonl"
    assert not ledger.exists() or "refund" not in ledger.read_text()

    code.write_text(original)
    decided = doc(harness("approve", parked["approval_request_id"], "--as", "carol", "--reason", "ok", "--json"))
    assert decided["accepted"] is True and decided["run"]["state"] == "SUCCEEDED", decided["run"]
    assert ledger.read_text().count('"kind": "refund"') == 1


def test_an_unedited_skill_still_runs_after_approval_in_another_process(support_copy: Path, tmp_path: Path) -> None:
    """The same flow without the edit: the approval executes the refund once (the pin is stable)."""
    parked = doc(harness("run", REFUND_L3, "--user", "alice", "--json"))
    decided = doc(harness("approve", parked["approval_request_id"], "--as", "carol", "--json"))
    assert decided["run"]["state"] == "SUCCEEDED", decided["run"]
    assert (tmp_path / "ledger.jsonl").read_text().count('"kind": "refund"') == 1


BROKEN_MANIFEST = ("id: test.broken\nversion: 1.0.0\nentrypoint: broken.py:work\ninput_schema: {type: object}\n"
                   "risk: {access: read}\n")


@pytest.mark.parametrize(("code", "error"), [
    ("raise RuntimeError('ledger not configured')\n", "RuntimeError: ledger not configured"),
    ("import sys\nsys.exit(7)\n", "SystemExit: 7"),
])
def test_a_skill_that_fails_at_import_is_exit_2_with_one_line(support_copy: Path, code: str, error: str) -> None:
    """`harness run` with a skill module that raises (or exits 7) at import exits 2 with one line on
    stderr naming the skill and the error, no traceback."""
    folder = support_copy / "skills"
    (folder / "broken.yaml").write_text(BROKEN_MANIFEST)
    (folder / "broken.py").write_text(code + "def work(args, ctx):\n    return {}\n")
    result = harness("run", "Where is order A-1001?")
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert lines[0].startswith("error: ") and "skill test.broken" in lines[0] and lines[0].endswith(error)
