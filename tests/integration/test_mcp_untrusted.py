"""An MCP tool's annotations are its server's word: against a real stdio server whose `peek` claims readOnlyHint
and writes a file (tests/fakes/lying_mcp_server.py), a server the MCP file does not mark trusted never gets a
tool run at L1 on that claim."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from typer.testing import CliRunner

from harness.cli import app
from harness.config import Runtime

from .test_mcp_skills import MCP, TESS, policy_of, runtime_for, tess

LYING = Path(__file__).resolve().parents[1] / "fakes" / "lying_mcp_server.py"


def write_lying_file(folder: Path, written: Path, **server: Any) -> Path:
    """An MCP file naming only the lying server (with `server`'s extra fields); `untrusted_tools` goes to the
    file's top level."""
    top = {"untrusted_tools": server.pop("untrusted_tools")} if "untrusted_tools" in server else {}
    path = folder / "mcp.yaml"
    path.write_text(json.dumps({**top, "servers": {
        "lying": {"command": [sys.executable, str(LYING), str(written)], **server}}}))
    return path


@pytest.fixture
def lying(tmp_path: Path) -> tuple[Path, Path]:
    """(folder, the file `peek` writes to)."""
    return tmp_path, tmp_path / "written.log"


def _runtime(folder: Path, written: Path, **server: Any) -> Runtime:
    return runtime_for(folder, write_lying_file(folder, written, **server))


def _listed(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("HARNESS_MCP_FILE", str(folder / "mcp.yaml"))
    monkeypatch.setenv("HARNESS_POLICY_FILE", str(MCP / "policy.yaml"))
    monkeypatch.setenv("HARNESS_SKILLS_DIRS", str(folder / "no-skills"))
    out = CliRunner().invoke(app, ["skills", "list", "--json", "--db", str(folder / "list.db")])
    assert out.exit_code == 0, out.output
    listed: dict[str, Any] = json.loads(out.stdout)
    return listed


def test_an_untrusted_servers_read_only_claim_waits_for_approval(lying: tuple[Path, Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool that claims readOnlyHint on a server not marked trusted is a non-idempotent write: the Run waits at
    L2 and nothing reaches the server until a human approves; `skills list` says it does not run on the server's
    word."""
    folder, written = lying
    rt = _runtime(folder, written)
    try:
        parked = rt.runs.create_run({"task": "peek at x", **TESS})
        assert parked.state == "AWAITING_HITL" and parked.approval_request_id, parked.error
        assert policy_of(rt, parked.run_id)["level"] == "L2"
        assert not written.exists()  # the "read" that writes was not sent
        skill = rt.registry.get("lying.peek")
        assert skill is not None and skill.manifest.risk.access == "write" and skill.manifest.idempotent is False
        _, done = rt.runs.decide(parked.approval_request_id, tess(rt), "approve", reason="test")
        assert done.state == "SUCCEEDED", done.error
        assert written.read_text().splitlines() == ["written by peek(x)"]
    finally:
        rt.close()
    listed = {s["id"]: s for s in _listed(folder, monkeypatch)["skills"]}
    peek = listed["lying.peek"]
    assert (peek["level"], peek["risk_from"], peek["on_servers_word"], peek["server_trusted"]) == (
        "L2", "untrusted", False, False)


def test_a_trusted_servers_read_only_claim_runs_at_l1(lying: tuple[Path, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`trusted: true` is the operator vouching for the server: its readOnlyHint is believed (L1, no approval), and
    `skills list` says the tool runs on the server's word."""
    folder, written = lying
    rt = _runtime(folder, written, trusted=True)
    try:
        result = rt.runs.create_run({"task": "peek at y", **TESS})
        assert result.state == "SUCCEEDED", result.error
        assert policy_of(rt, result.run_id)["level"] == "L1"
        assert written.read_text().splitlines() == ["written by peek(y)"]
    finally:
        rt.close()
    peek = {s["id"]: s for s in _listed(folder, monkeypatch)["skills"]}["lying.peek"]
    assert (peek["level"], peek["risk_from"], peek["on_servers_word"], peek["server_trusted"]) == (
        "L1", "annotations", True, True)


def test_the_operators_rating_decides_on_an_untrusted_server(lying: tuple[Path, Path]) -> None:
    """A risk the MCP file gives for the tool is the operator's word, trusted server or not."""
    folder, written = lying
    rt = _runtime(folder, written, tools={"peek": {"risk": {"access": "read"}}})
    try:
        result = rt.runs.create_run({"task": "peek at z", **TESS})
        assert result.state == "SUCCEEDED" and policy_of(rt, result.run_id)["level"] == "L1"
    finally:
        rt.close()


def test_untrusted_tools_refuse_withholds_the_tool(lying: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """With `untrusted_tools: refuse`, an unconfigured tool of an untrusted server is not offered: a Run that plans
    it is refused without reaching the server, and `skills list` names it as not offered."""
    folder, written = lying
    rt = _runtime(folder, written, untrusted_tools="refuse")
    try:
        assert rt.registry.get("lying.peek") is None
        result = rt.runs.create_run({"task": "peek at w", **TESS})
        assert result.state == "CLOSED_FAILED" and "'lying.peek', which is not a known skill" in (result.error or "")
        assert not written.exists()
    finally:
        rt.close()
    listed = _listed(folder, monkeypatch)
    assert "lying.peek" not in {s["id"] for s in listed["skills"]}
    assert [(w["server"], w["tool"]) for w in listed["withheld"]] == [("lying", "peek")]
    assert "untrusted_tools: refuse" in listed["withheld"][0]["reason"]
