"""Naming an agent defined in Python wherever a runtime is built (issue 38): `module:attr` for `harness
--agent`, `serve --agent`, `worker --agent`, HARNESS_AGENT, a config file and `Harness(...)`; a bad
reference is bad input (exit 2, one line naming the problem); a process whose skills differ from a parked
Run's refuses to approve it before recording anything, the service with a 409.

The agent is tests/fakes/ops_agent.py; the processes of the same flow are in
tests/integration/test_agent_processes.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import harness as harness_pkg
from harness import Harness
from harness.cli import app
from harness.config import build_runtime
from harness.domain.errors import SkillsUnavailableError
from harness.settings import Settings
from tests.acceptance.api_helpers import key, make_client
from tests.fakes.ops_agent import TASK, ops, ops_changed


def harness(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(("args", "env", "problem"), [
    (["--agent", "no_such_module_here:agent", "approvals"], None, "no module named 'no_such_module_here'"),
    (["--agent", "tests.fakes.ops_agent:missing", "approvals"], None,
     "module tests.fakes.ops_agent has no attribute 'missing'"),
    (["--agent", "tests.fakes.ops_agent:not_an_agent", "approvals"], None, "is a str, not a harness.Agent"),
    (["--agent", "harness:Agent", "approvals"], None, "is a class; name an Agent instance"),
    (["approvals"], "tests.fakes.ops_agent:missing", "has no attribute 'missing'"),
    (["worker", "--agent", "tests.fakes.ops_agent:not_an_agent"], None, "not a harness.Agent"),
])
def test_a_bad_agent_reference_is_exit_2_naming_it(args: list[str], env: str | None, problem: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference to a module that is not there, an attribute it lacks, or something that is not an Agent
    is exit 2 with one line on stderr naming the reference and the problem, no traceback; `worker` says
    so before Celery starts."""
    monkeypatch.setenv("HARNESS_DATABASE_URL", str(tmp_path / "h.db"))
    if env is not None:
        monkeypatch.setenv("HARNESS_AGENT", env)
    result = harness(*args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("error: agent ") and problem in lines[0], lines[0]


def test_serve_with_a_bad_agent_reference_exits_2_before_it_listens(tmp_path: Path) -> None:
    """`harness serve --agent` naming a module that is not there: exit 2, one line naming it, no traceback
    (its own process: serve configures the process's logging)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_") or k == "HARNESS_DATA_DIR"}
    env["PYTHONPATH"] = str(Path(harness_pkg.__file__).parents[1])
    done = subprocess.run([sys.executable, "-m", "harness.cli", "serve", "--agent", "no_such_module_here:agent",
                           "--port", "0", "--db", str(tmp_path / "h.db")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no module named 'no_such_module_here'" in lines[0], done.stderr
    assert not (tmp_path / "h.db").exists(), "the database was made before the bad input was named"


def test_every_way_of_naming_the_agent_finds_the_same_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Harness("module:attr")`, HARNESS_AGENT and a config file's `agent: module:attr` (not taken for a
    file beside the config) give the Python-defined agent, with its code skills."""
    with Harness("tests.fakes.ops_agent:ops", db=str(tmp_path / "a.db"), data_dir=tmp_path / "data") as h:
        assert h.runtime.agent is ops and h.runtime.registry.get("ops.restart") is not None
    monkeypatch.setenv("HARNESS_AGENT", "tests.fakes.ops_agent:ops")
    rt = build_runtime(Settings.from_env(db=str(tmp_path / "b.db"), data_dir=tmp_path / "data"))
    try:
        assert rt.agent is ops
    finally:
        rt.close()
    monkeypatch.delenv("HARNESS_AGENT")
    config = tmp_path / "conf" / "harness.yaml"
    config.parent.mkdir()
    config.write_text("agent: tests.fakes.ops_agent:ops_changed\n")
    monkeypatch.setenv("HARNESS_CONFIG_FILE", str(config))
    rt = build_runtime(Settings.from_env(db=str(tmp_path / "c.db"), data_dir=tmp_path / "data"))
    try:
        assert rt.agent is ops_changed
    finally:
        rt.close()


def test_a_changed_skill_refuses_the_approval_before_it_is_recorded(tmp_path: Path, call_log: Path) -> None:
    """A Run parked by `ops`; the same agent with its skill changed (`ops_changed`) refuses to approve it,
    naming ops.restart as changed: the request is still pending, the Run AWAITING_HITL, the skill never ran;
    `ops` then approves it and the Run succeeds, the skill run once."""
    db, data = str(tmp_path / "ops.db"), tmp_path / "data"
    with Harness(ops, db=db, data_dir=data) as first:
        parked = first.run(TASK, user="alice")
    assert parked.state == "AWAITING_HITL" and parked.approval_request_id
    with Harness(ops_changed, db=db, data_dir=data) as changed:
        with pytest.raises(SkillsUnavailableError, match=r"changed since the Run started: ops\.restart\)"):
            changed.approve(parked.approval_request_id, as_="carol")
        assert [r.request_id for r in changed.approvals(parked.run_id)] == [parked.approval_request_id]
        assert changed.get(parked.run_id).state == "AWAITING_HITL"
    assert call_log.read_text() == ""
    with Harness(ops, db=db, data_dir=data) as again:
        decided = again.approve(parked.approval_request_id, as_="carol")
    assert decided.accepted and decided.run.state == "SUCCEEDED", decided.run.error
    assert len(call_log.read_text().splitlines()) == 1


def test_the_service_without_the_agent_answers_409_and_records_nothing(tmp_path: Path, call_log: Path) -> None:
    """The service of the bundled support agent is asked to approve an `ops` Run: 409 naming ops.restart
    as missing; the Run still waits with its request pending, and `ops` can approve it afterwards."""
    db, data = str(tmp_path / "ops.db"), tmp_path / "data"
    with Harness(ops, db=db, data_dir=data) as h:
        parked = h.run(TASK, user="alice")
    request_id = parked.approval_request_id
    support = build_runtime(Settings(db=db, data_dir=data))
    try:
        with make_client(support) as client:
            answer = client.post(f"/api/v1/approvals/{request_id}/decision", headers=key("carol"),
                                 json={"decision": "approve", "reason": "go"})
            assert answer.status_code == 409, answer.text
            assert answer.json()["error"] == "conflict" and "missing: ops.restart" in answer.json()["detail"]
            assert client.get(f"/api/v1/approvals/{request_id}", headers=key("carol")).json()["status"] == "pending"
    finally:
        support.close()
    with Harness(ops, db=db, data_dir=data) as h:
        assert h.get(parked.run_id).state == "AWAITING_HITL"
        assert h.approve(request_id, as_="carol").run.state == "SUCCEEDED"
    assert len(call_log.read_text().splitlines()) == 1


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-your-own-agent.md"
PARK_HELPDESK = """
from harness import Harness
from helpdesk_agent import helpdesk
with Harness(helpdesk, db="helpdesk.db") as h:
    run = h.run("Please unlock the account of jdoe", user="sam")
    assert run.state == "AWAITING_HITL", run.error
    print(run.approval_request_id)
"""


def test_the_guides_approve_from_anywhere_works_as_written(tmp_path: Path) -> None:
    """The guide's files written out, a Run of its helpdesk agent parked by one process; the guide's
    `harness --agent helpdesk_agent:helpdesk approve REQUEST_ID --as lee ...` line, run as written from
    that folder, approves it in another process and the Run succeeds."""
    text = GUIDE.read_text(encoding="utf-8")
    for m in re.finditer(r"^```\w+ ([\w./-]+)\n(.*?)^```$", text, re.S | re.M):
        if m.group(1) != "main.py":
            (tmp_path / m.group(1)).write_text(m.group(2), encoding="utf-8")
    section = text.split("## 7. Serve it, and approve from anywhere", 1)[1].split("\n## ", 1)[0]
    (line,) = [ln.split("  #")[0].strip() for ln in section.splitlines() if ln.startswith("harness --agent")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_") or k == "HARNESS_DATA_DIR"}
    env["PYTHONPATH"] = str(Path(harness_pkg.__file__).parents[1])  # this tree's harness, not the guide's folder

    def process(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                              check=False)

    parked = process(sys.executable, "-c", PARK_HELPDESK)
    assert parked.returncode == 0, parked.stderr
    request_id = parked.stdout.strip()
    argv = shlex.split(line.replace("REQUEST_ID", request_id))
    script = Path(sys.executable).with_name("harness")  # the console script: the folder is not on sys.path
    command = [str(script)] if script.exists() else [sys.executable, "-m", "harness.cli"]
    approved = process(*command, *argv[1:], "--json")
    assert approved.returncode == 0, approved.stderr
    run = json.loads(approved.stdout)["run"]
    assert run["state"] == "SUCCEEDED" and run["answer"].startswith("I unlocked the account of jdoe"), run


def test_a_parked_runs_hint_names_the_agent_to_approve_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            call_log: Path) -> None:
    """`harness --agent tests.fakes.ops_agent:ops run ...` parks; the line it suggests for the decision
    names the same agent (an approval without it would be refused)."""
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path / "data"))
    result = harness("--agent", "tests.fakes.ops_agent:ops", "run", TASK, "--user", "alice",
                     "--db", str(tmp_path / "h.db"))
    assert result.exit_code == 0, result.output
    assert "decide with: harness --agent tests.fakes.ops_agent:ops approve " in result.stdout, result.stdout


def test_the_agent_named_before_a_command_is_that_commands_alone(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`harness --agent X cmd` names X for that command only: a later command in the same process (a test
    runner, a program calling the CLI in-process) that names none falls back to the settings' agent."""
    from harness.cli.support import agent_reference

    monkeypatch.delenv("HARNESS_AGENT", raising=False)
    monkeypatch.setenv("HARNESS_DATABASE_URL", str(tmp_path / "h.db"))
    done = harness("--agent", "tests.fakes.ops_agent:ops", "skills", "list", "--json")
    assert done.exit_code == 0, done.output
    assert "ops." in done.stdout
    assert agent_reference() is None
