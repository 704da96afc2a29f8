"""MCP servers' tools as governed skills, against real servers on loopback: `mcp-server-git` from PyPI over
stdio and a small MCPServer over streamable HTTP (tests/fixtures/mcp/notes_server.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

pytest.importorskip("mcp")
pytest.importorskip("mcp_server_git")

from mcp import Client
from typer.testing import CliRunner

from harness.adapters.mcp_client import McpConnection
from harness.cli import app
from harness.config import Runtime, build_runtime
from harness.domain.contracts import CallerIdentity
from harness.settings import Settings

from ..acceptance.checks import assert_audit_clean

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MCP = FIXTURES / "mcp"
TESS = {"tenant_id": "t1", "user_id": "tess"}


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def _commits(repo: Path) -> int:
    return int(_git(repo, "rev-list", "--count", "HEAD").strip())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch git repository with one commit."""
    path = tmp_path_factory.mktemp("mcp-git") / "repo"
    path.mkdir()
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "t@example.org")
    _git(path, "config", "user.name", "t")
    (path / "a.txt").write_text("a\n")
    _git(path, "add", "a.txt")
    _git(path, "commit", "-qm", "first")
    return path


def start_notes_server() -> tuple[subprocess.Popen[bytes], str]:
    """The notes server on a free loopback port, once it answers."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(MCP / "notes_server.py"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("the notes server exited at start") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the notes server did not start listening")


@pytest.fixture(scope="module")
def notes_url() -> Iterator[str]:
    """The module's notes server over streamable HTTP."""
    proc, url = start_notes_server()
    yield url
    proc.terminate()
    proc.wait(10)


def write_mcp_file(folder: Path, repo: Path | None, notes_url: str) -> Path:
    """The MCP config of these tests: git over stdio (unless `repo` is None), notes over HTTP (slow: 0.5 s,
    its breaker opens at the first failure); both trusted, so their annotations decide their tools' risk."""
    path = folder / "mcp.yaml"
    servers: dict[str, object] = {} if repo is None else {
        "git": {"command": [sys.executable, "-m", "mcp_server_git", "--repository", str(repo)], "trusted": True}}
    servers["notes"] = {
        "url": notes_url, "trusted": True, "include": ["notes_read", "notes_add", "slow"], "price_per_call_usd": 0.001,
        "tools": {"slow": {"timeout_s": 0.5, "breaker": {"failure_threshold": 1, "reset_timeout_s": 600}}}}
    path.write_text(json.dumps({"servers": servers}))
    return path


def runtime_for(folder: Path, mcp_file: Path) -> Runtime:
    """A runtime whose only skills are the MCP servers' tools (the test rules, policy and identities)."""
    empty = folder / "no-skills"
    empty.mkdir(exist_ok=True)
    return build_runtime(Settings(
        db=str(folder / "mcp.db"), skills_dirs=(empty,), policy_file=MCP / "policy.yaml",
        llm_rules=MCP / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
        data_dir=folder / "data", mcp_file=mcp_file))


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory, repo: Path, notes_url: str) -> Iterator[Runtime]:
    """One runtime for the module: its servers start once and are kept, as in a real process."""
    folder = tmp_path_factory.mktemp("mcp-rt")
    runtime = runtime_for(folder, write_mcp_file(folder, repo, notes_url))
    yield runtime
    runtime.close()


def tool_traces(rt: Runtime, run_id: str) -> list[dict[str, object]]:
    rt.store.drain_all()
    return [r.data() for r in rt.store.trace_of(run_id) if r.kind == "tool"]


def policy_of(rt: Runtime, run_id: str) -> dict[str, object]:
    rt.store.drain_all()
    (policy,) = [r.data() for r in rt.store.trace_of(run_id) if r.kind == "policy"]
    return policy


def tess(rt: Runtime) -> CallerIdentity:
    return rt.identities.resolve("t1/tess")


def test_read_tools_of_a_stdio_server_run_at_l1(rt: Runtime, repo: Path) -> None:
    """git_status and git_log, read-only by their annotations, run without approval and are traced as MCP calls
    with a cost each."""
    result = rt.runs.create_run({"task": f"look at {repo}", **TESS})
    assert result.state == "SUCCEEDED", result.error
    assert "Repository status" in (result.answer or "") and "first" in (result.answer or "")
    assert policy_of(rt, result.run_id)["level"] == "L1"
    traces = tool_traces(rt, result.run_id)
    assert {(t["skill_id"], t["call_kind"], t["isolation"], t["status"]) for t in traces} == {
        ("git.git_status", "mcp", "mcp:stdio", "ok"), ("git.git_log", "mcp", "mcp:stdio", "ok")}
    sources = {r.data()["source"] for r in rt.store.trace_of(result.run_id) if r.kind == "cost"}
    assert {"mcp:git:git_status", "mcp:git:git_log"} <= sources
    assert_audit_clean(rt)


def test_a_commit_parks_for_approval_and_commits_once(rt: Runtime, repo: Path) -> None:
    """git_commit is a non-idempotent write: the Run waits at L2, and once approved the server commits once."""
    (repo / "b.txt").write_text("b\n")
    _git(repo, "add", "b.txt")
    before = _commits(repo)
    parked = rt.runs.create_run({"task": f"commit {repo} as add b", **TESS})
    assert parked.state == "AWAITING_HITL" and parked.approval_request_id
    assert policy_of(rt, parked.run_id)["level"] == "L2"
    assert _commits(repo) == before  # nothing reached the server yet
    _, done = rt.runs.decide(parked.approval_request_id, tess(rt), "approve", reason="test")
    assert done.state == "SUCCEEDED", done.error
    assert _commits(repo) == before + 1
    assert _git(repo, "log", "-1", "--format=%s").strip() == "add b"
    (trace,) = tool_traces(rt, parked.run_id)
    assert trace["skill_id"] == "git.git_commit" and trace["attempts"] == 1 and trace["idempotent"] is False


def test_a_rejected_commit_never_reaches_the_server(rt: Runtime, repo: Path) -> None:
    """A commit a human rejects is never sent: the repository keeps its commits and its staged change."""
    (repo / "c.txt").write_text("c\n")
    _git(repo, "add", "c.txt")
    before = _commits(repo)
    parked = rt.runs.create_run({"task": f"commit {repo} as add c", **TESS})
    assert parked.state == "AWAITING_HITL" and parked.approval_request_id
    _, closed = rt.runs.decide(parked.approval_request_id, tess(rt), "reject", reason="not now")
    assert closed.state == "CLOSED_REJECTED"
    assert _commits(repo) == before and "c.txt" in _git(repo, "diff", "--cached", "--name-only")
    assert tool_traces(rt, parked.run_id) == []
    _git(repo, "reset", "-q")


def test_policy_and_permissions_govern_mcp_tools(rt: Runtime, repo: Path) -> None:
    """A guardrail on an MCP tool's argument refuses the call, and Cedar keeps other roles away from it."""
    before = _commits(repo)
    forced = rt.runs.create_run({"task": f"commit {repo} as force it", **TESS})
    assert forced.state == "CLOSED_REJECTED" and "guardrail.no_forced_commits" in (forced.error or "")
    outsider = rt.runs.create_run({"task": f"look at {repo}", "tenant_id": "t1", "user_id": "pat"})
    assert outsider.state == "CLOSED_REJECTED" and "permission.cedar" in (outsider.error or "")
    assert _commits(repo) == before
    assert tool_traces(rt, forced.run_id) == tool_traces(rt, outsider.run_id) == []


def test_tools_of_an_http_server_read_at_l1_and_write_after_approval(rt: Runtime) -> None:
    """Over streamable HTTP: a read-only tool runs at once; a tool without annotations is a write that waits
    for approval and then reaches the server once."""
    empty = rt.runs.create_run({"task": "read notes on http", **TESS})
    assert empty.state == "SUCCEEDED" and empty.artifacts["read"] == {"topic": "http", "notes": []}
    parked = rt.runs.create_run({"task": "note http: hello", **TESS})
    assert parked.state == "AWAITING_HITL" and policy_of(rt, parked.run_id)["level"] == "L2"
    _, done = rt.runs.decide(parked.approval_request_id or "", tess(rt), "approve", reason="test")
    assert done.state == "SUCCEEDED" and done.artifacts["add"] == {"topic": "http", "count": 1}
    again = rt.runs.create_run({"task": "read notes on http", **TESS})
    assert again.artifacts["read"]["notes"] == ["hello"]
    (trace,) = tool_traces(rt, parked.run_id)
    assert trace["isolation"] == "mcp:http"


def test_a_hanging_tool_times_out_and_opens_its_breaker(rt: Runtime) -> None:
    """A server that does not answer costs the step its time limit (not longer); the failure opens the
    tool's breaker, so the next call is refused without reaching the server."""
    started = time.monotonic()
    hung = rt.runs.create_run({"task": "wait 5", **TESS})
    assert time.monotonic() - started < 4
    assert hung.state == "CLOSED_FAILED"
    (trace,) = tool_traces(rt, hung.run_id)
    assert trace["error_code"] == "timeout"
    refused = rt.runs.create_run({"task": "wait 0", **TESS})
    assert refused.state == "CLOSED_FAILED"
    (trace,) = tool_traces(rt, refused.run_id)
    assert trace["error_code"] == "circuit_open" and trace["attempts"] == 0


def _server_pids(repo: Path) -> list[int]:
    # the repository's path is this module's own temporary folder: only servers these tests started match
    out = subprocess.run(["pgrep", "-f", f"mcp_server_git --repository {repo}"], check=False, capture_output=True,
                         text=True)
    return [int(p) for p in out.stdout.split()]


def test_a_crashed_stdio_server_is_restarted_and_the_restart_traced(rt: Runtime, repo: Path) -> None:
    """A server that died between calls is started again at its next use, and the Run that needed it
    succeeds; the restart is on the audit trail."""
    assert rt.runs.create_run({"task": f"look at {repo}", **TESS}).state == "SUCCEEDED"
    assert rt.mcp is not None
    connection = cast(McpConnection, rt.mcp.connections["git"])  # the stdio client, which restarts
    for pid in _server_pids(repo):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while connection.pending_restart() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # the kill reaches the connection as the end of the server's output
    before = len(rt.store.audit_events(event="mcp_server_restarted"))
    result = rt.runs.create_run({"task": f"look at {repo}", **TESS})
    assert result.state == "SUCCEEDED", result.error
    events = rt.store.audit_events(event="mcp_server_restarted")[before:]
    assert [(e.detail["server"], e.detail["reason"]) for e in events] == [("git", "the server process exited")]


def test_a_tool_whose_schema_changes_mid_run_is_refused(tmp_path: Path) -> None:
    """A server upgraded while a Run waits for approval: the approved call is refused (manifest_changed) and
    never sent; a new Run pins the new schema."""
    proc, url = start_notes_server()
    runtime = runtime_for(tmp_path, write_mcp_file(tmp_path, None, url))
    try:
        parked = runtime.runs.create_run({"task": "note upgrade: before", **TESS})
        assert parked.state == "AWAITING_HITL"
        pinned = runtime.registry.get("notes.notes_add")
        assert pinned is not None

        async def upgrade() -> None:
            async with Client(url, cache=None) as client:
                await client.call_tool("upgrade", {})
        asyncio.run(upgrade())
        _, done = runtime.runs.decide(parked.approval_request_id or "", tess(runtime), "approve", reason="test")
        assert done.state == "CLOSED_FAILED" and "manifest_changed" in (done.error or "")
        read = runtime.runs.create_run({"task": "read notes on upgrade", **TESS})
        assert read.artifacts["read"]["notes"] == []  # the refused call never reached the server
        current = runtime.registry.get("notes.notes_add")
        assert current is not None and current.manifest_hash != pinned.manifest_hash
        assert "author" in current.manifest.input_schema["properties"]
    finally:
        runtime.close()
        proc.terminate()
        proc.wait(10)


def test_skills_list_shows_mcp_tools_with_source_and_risk(tmp_path: Path, repo: Path, notes_url: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`harness skills list` names each MCP tool's server and transport, its risk, level and where the risk came
    from; closing the runtime stops the stdio server it started."""
    monkeypatch.setenv("HARNESS_MCP_FILE", str(write_mcp_file(tmp_path, repo, notes_url)))
    monkeypatch.setenv("HARNESS_POLICY_FILE", str(MCP / "policy.yaml"))
    (tmp_path / "no-skills").mkdir()
    monkeypatch.setenv("HARNESS_SKILLS_DIRS", str(tmp_path / "no-skills"))
    before = set(_server_pids(repo))
    out = CliRunner().invoke(app, ["skills", "list", "--json", "--db", str(tmp_path / "list.db")])
    assert out.exit_code == 0, out.output
    skills = {s["id"]: s for s in json.loads(out.stdout)["skills"]}
    assert (skills["git.git_status"]["source"], skills["git.git_status"]["level"]) == ("mcp:git (stdio)", "L1")
    assert skills["git.git_commit"]["level"] == "L2" and skills["git.git_commit"]["idempotent"] is False
    assert skills["git.git_commit"]["risk_from"] == "annotations"
    assert skills["notes.notes_add"]["source"] == "mcp:notes (http)"
    assert (skills["notes.notes_add"]["risk_from"], skills["notes.notes_add"]["level"]) == ("default", "L2")
    assert "notes.upgrade" not in skills
    assert set(_server_pids(repo)) == before  # the listing's own git server was shut down with it


def test_an_unreachable_server_fails_the_run_at_preparing(tmp_path: Path) -> None:
    """A server that cannot be reached fails the Run with a reason naming it, before any plan."""
    runtime = runtime_for(tmp_path, write_mcp_file(tmp_path, None, f"http://127.0.0.1:{_free_port()}/mcp"))
    try:
        result = runtime.runs.create_run({"task": "read notes on x", **TESS})
        assert result.state == "CLOSED_FAILED" and "mcp_unavailable" in (result.error or "")
        assert "'notes'" in (result.error or "")
    finally:
        runtime.close()
