"""The remote sandbox provider: `harness sandbox serve` runs this host's bubblewrap sandbox for a harness
process over HTTP, and the same Run gives the same result, the same trace and the same costs through it as
through the local provider — its kept instance, its leased port and its billed seconds included. The server
refuses a request without its token (401) or with too large a body (413); a server that is down fails the
Run's call with a reason naming it, at once.

The server runs as on another host where the machine allows it: in a PID namespace of its own (the pids of
its instances mean nothing in this host's /proc, so the pool must ask the server whether an instance runs
and tell the server to stop it) and a mount namespace where the tests' folders are hidden (the skills' code
and the Runs' working directories exist only on the harness side, so each call must carry them)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml

from harness import Agent, Harness
from harness.adapters.sandbox.server import MAX_BODY
from harness.adapters.sql import schema as t
from harness.config import Runtime, build_runtime
from harness.domain.sandbox import DEAD
from harness.pipeline.artifacts import stored_bytes
from tests.acceptance.agent_skills import RULES, TESTER
from tests.fakes.prying_skills import pry_in_process, pry_sandboxed
from tests.integration.conftest import port_open
from tests.integration.instance_skills import INSTANCE_RULES, instance_settings
from tests.integration.test_artifacts import TESS, sandbox_runtime
from tests.integration.test_code_skill_sandbox import CEDAR, IDENTITIES, POLICY, SECRETS, _rules
from tests.integration.test_sandbox import need_bwrap

SERVE_AND_QUERY = {"name": "serve_query", "when": "^serve (?P<text>\\w+) and query$", "plan": {
    "answer_template": "the site said {c.body}",
    "steps": [
        {"id": "a", "tool_call": {"skill": "test.devserver", "arguments": {"action": "start", "text": "{text}"}},
         "output_key": "a"},
        {"id": "c", "tool_call": {"skill": "test.devserver", "arguments": {"action": "query"}},
         "depends_on": ["a"], "output_key": "c"},
    ]}}


#: the sandbox server's process (the test module's one), for the tests that look at what it runs
SERVER: dict[str, Any] = {}


def elsewhere(hidden: Path) -> list[str]:
    """The command prefix that starts a process as on another host: PID and mount namespaces of its own, with
    an empty folder mounted over `hidden`; [] where the machine refuses that."""
    prefix = ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
              'mount -t tmpfs hidden "$0" && exec "$@"', str(hidden)]
    try:
        done = subprocess.run([*prefix, "test", "!", "-e", str(hidden / "probe")], capture_output=True, timeout=10,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return prefix if done.returncode == 0 else []


def descendants(root: int) -> set[int]:
    """The pids of every running process below `root` (from this host's /proc; a zombie does not run: the
    server, first process of its namespace, does not reap the instance holders it inherits)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, parent = stat.rsplit(")", 1)[1].split()[:2]
            if state not in ("Z", "X"):
                parents[int(entry.name)] = int(parent)
    below, grew = set(), True
    while grew:
        more = {pid for pid, parent in parents.items() if (parent == root or parent in below) and pid not in below}
        below |= more
        grew = bool(more)
    return below


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return f"{pid} (gone)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A real `harness sandbox serve` process on a free loopback port, as on another host where the machine
    allows it: (its URL, its token)."""
    need_bwrap()
    token, port = secrets.token_urlsafe(24), free_port()
    hidden = tmp_path_factory.getbasetemp()  # every folder of the harness side (skills, data, workdirs)
    (hidden / "probe").touch()
    prefix = elsewhere(hidden)
    own = Path(tempfile.mkdtemp(prefix="harness-sandbox-server-", dir="/var/tmp" if prefix else hidden))
    proc = subprocess.Popen([*prefix, str(Path(sys.executable).parent / "harness"), "sandbox", "serve",
                             "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(own)],
                            env={**os.environ, "HARNESS_SANDBOX_TOKEN": token},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    SERVER["process"], SERVER["isolated"] = proc, bool(prefix)
    deadline = time.monotonic() + 15
    while not port_open(port):
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "the server exited"
        assert time.monotonic() < deadline, "the sandbox server did not start listening"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", token
    SERVER.clear()
    os.killpg(proc.pid, signal.SIGTERM)  # unshare itself ignores SIGTERM while it waits for the server
    proc.wait(10)
    shutil.rmtree(own, ignore_errors=True)


def runtime(folder: Path, **extra: Any) -> Runtime:
    folder.mkdir()
    settings = instance_settings(folder, **extra)
    (folder / "rules.yaml").write_text(yaml.safe_dump({"rules": [SERVE_AND_QUERY, *INSTANCE_RULES, *RULES]}))
    return build_runtime(settings)


def close(rt: Runtime) -> None:
    pool = rt.tools.sandbox_pool
    assert pool is not None
    for row in pool.table.live():  # nothing outlives a test
        pool.table.end_now(row, DEAD, "the test ended", rt.store.clock.now())
    pool.stop_ended()
    rt.close()


def observed(rt: Runtime, run_id: str) -> dict[str, Any]:
    """What a Run left that must not depend on where its sandbox ran."""
    result = rt.runs.result(run_id)
    tools = [{k: v for k, v in r.data().items() if k in ("skill_id", "call_kind", "isolation", "status", "attempts",
                                                        "result_hash", "error_code")}
             for r in rt.store.trace_of(run_id) if r.kind == "tool"]
    with rt.store.engine.connect() as db:
        costs = db.execute(sa.select(t.costs.c.source).where(t.costs.c.run_id == run_id)
                           .order_by(t.costs.c.source)).scalars().all()
    audit = [e.event for e in rt.store.audit_events(run_id=run_id) if e.event.startswith("sandbox_")]
    return {"state": result.state, "answer": result.answer, "artifacts": result.artifacts, "tools": tools,
            "costs": costs, "audit": audit}


def providers(rt: Runtime, run_id: str) -> set[str | None]:
    return {r.data().get("sandbox_provider") for r in rt.store.trace_of(run_id) if r.kind == "tool"}


@pytest.mark.parametrize("choice", ["everything", "tenant"])
def test_the_same_run_gives_the_same_result_through_the_remote_provider(
        server: tuple[str, str], tmp_path: Path, call_log: Path, monkeypatch: pytest.MonkeyPatch, choice: str) -> None:
    """A Run whose kept instance serves a page on its leased port in step a and fetches it in step c ends the
    same, with the same tool calls, costs (the instance's seconds, billed once) and instance events, whether
    its sandbox is this host's or the server's — chosen for everything or for the Run's tenant; the trace
    names the remote provider."""
    url, token = server
    monkeypatch.setenv("HARNESS_SANDBOX_TOKEN", token)
    remote: dict[str, Any] = ({"sandbox_provider": "remote"} if choice == "everything"
                              else {"sandbox_remote_tenants": (TESTER["tenant_id"],)})
    seen = []
    for name, extra in (("local", {}), ("remote", {"sandbox_url": url, **remote})):
        rt = runtime(tmp_path / name, sandbox="bwrap", **extra)
        try:
            done = rt.runs.create_run({"task": "serve hello and query", **TESTER})
            assert done.state == "SUCCEEDED" and done.answer == "the site said hello", done.error
            seen.append(observed(rt, done.run_id))
            assert providers(rt, done.run_id) == ({None} if name == "local" else {"remote"})
            row = rt.tools.sandbox_pool.table.get(done.run_id, "test.devserver") if rt.tools.sandbox_pool else None
            assert row is not None and row.state == "released" and row.calls == 2 and row.ports
            assert rt.runs.ledger.run_total(done.run_id).sandbox_s == pytest.approx(row.held_s, abs=1e-5)  # billed once
        finally:
            close(rt)
    local, remote_seen = seen
    assert remote_seen == local
    assert local["costs"] == ["llm:scripted:plan", "sandbox_instance:bwrap:test.devserver"]
    assert local["audit"] == ["sandbox_instance_created", "sandbox_instance_released"]


def test_a_kept_instance_on_the_server_is_asked_after_and_stopped_there(
        server: tuple[str, str], tmp_path: Path, call_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool asks the server, not this host's /proc, whether a kept instance still runs (the Run's second
    call reuses it: one created, none re-created), and the Run's close stops its process on the server."""
    url, token = server
    monkeypatch.setenv("HARNESS_SANDBOX_TOKEN", token)
    server_process = SERVER["process"]
    before = descendants(server_process.pid)
    rt = runtime(tmp_path / "kept", sandbox="bwrap", sandbox_provider="remote", sandbox_url=url)
    try:
        done = rt.runs.create_run({"task": "serve hello and query", **TESTER})
        assert done.state == "SUCCEEDED" and done.answer == "the site said hello", done.error
        audit = [e for e in rt.store.audit_events(run_id=done.run_id) if e.event.startswith("sandbox_")]
        assert [e.event for e in audit] == ["sandbox_instance_created", "sandbox_instance_released"]
        pool = rt.tools.sandbox_pool
        assert pool is not None
        row = pool.table.get(done.run_id, "test.devserver")
        assert row is not None and row.provider == "remote" and row.pid is None  # stopped, and forgotten
        deadline = time.monotonic() + 10
        while (left := descendants(server_process.pid) - before) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"the instance's processes still run on the server: {[command(p) for p in sorted(left)]}"
    finally:
        close(rt)


def test_the_server_refuses_a_request_without_its_token_or_too_large(server: tuple[str, str]) -> None:
    """No token, a wrong token: 401 before anything runs; a body past the bound: 413; the right token: the
    server's isolation."""
    url, token = server
    assert httpx.get(f"{url}/v1/sandbox").status_code == 401
    wrong = httpx.post(f"{url}/v1/run", json={}, headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 401 and "token" in wrong.json()["error"]
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{url}/v1/sandbox", headers=auth).json() == {"isolation": "bwrap"}
    too_large = httpx.post(f"{url}/v1/run", content=b"x" * (MAX_BODY + 1), headers=auth)
    assert too_large.status_code == 413
    bad = httpx.post(f"{url}/v1/run", json={"skill_id": "x"}, headers=auth)
    assert bad.status_code == 400 and "not a valid request" in bad.json()["error"]


def test_a_wrong_token_fails_the_runs_call_with_the_reason(
        server: tuple[str, str], tmp_path: Path, call_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A harness process holding another token gets nothing run: its call fails sandbox_unavailable, saying
    the server refused the token."""
    url, _ = server
    monkeypatch.setenv("HARNESS_SANDBOX_TOKEN", "a-token-the-server-does-not-hold")
    rt = runtime(tmp_path / "wrong", sandbox_provider="remote", sandbox_url=url)
    try:
        done = rt.runs.create_run({"task": "serve hello", **TESTER})
        assert done.state == "CLOSED_FAILED" and "refused the token (401)" in str(done.error), done.error
    finally:
        close(rt)


def test_a_server_that_is_down_fails_the_run_at_once_naming_it(
        tmp_path: Path, call_log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at the provider's URL: the Run fails within seconds (no hang), the reason naming the
    server and the call sandbox_unavailable."""
    need_bwrap()
    monkeypatch.setenv("HARNESS_SANDBOX_TOKEN", "a-token-of-a-server-that-is-down")
    url = f"http://127.0.0.1:{free_port()}"
    rt = runtime(tmp_path / "down", sandbox_provider="remote", sandbox_url=url)
    try:
        began = time.monotonic()
        done = rt.runs.create_run({"task": "serve hello", **TESTER})
        assert time.monotonic() - began < 10
        assert done.state == "CLOSED_FAILED" and f"the sandbox server at {url} cannot be reached" in str(done.error)
        (tool,) = [r.data() for r in rt.store.trace_of(done.run_id) if r.kind == "tool"]
        assert tool["error_code"] == "sandbox_unavailable" and tool["sandbox_provider"] == "remote"
    finally:
        close(rt)


def test_the_files_a_call_writes_on_the_server_come_back_as_the_runs_files(
        server: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandboxed skill that writes files in its working directory on the server gives the Run the same
    files (names, sizes, hashes, filtering), the same skipped ones and the same streams as on this host: the
    files travel back into the Run's working directory here before they are collected."""
    url, token = server
    monkeypatch.setenv("HARNESS_SANDBOX_TOKEN", token)
    seen = []
    providers: tuple[tuple[str, dict[str, Any]], ...] = (
        ("local", {}), ("remote", {"sandbox_provider": "remote", "sandbox_url": url}))
    for name, extra in providers:
        (tmp_path / name).mkdir()
        rt = sandbox_runtime(tmp_path / name, f"sqlite:///{tmp_path / name / 'h.db'}", **extra)
        try:
            result = rt.runs.create_run({"task": "report", **TESS})
            assert result.state == "SUCCEEDED", result.error
            outcome = (rt.store.get_run(result.run_id).context or {})["steps"]["a"]
            seen.append({
                "files": [(f.name, f.size, f.sha256, f.media_type, f.filtered) for f in result.files],
                "bytes": [stored_bytes(rt.contents, f) for f in result.files],
                "skipped": outcome["skipped_files"], "stdout": outcome["stdout"], "stderr": outcome["stderr"]})
        finally:
            rt.close()
    local, remote = seen
    assert remote == local
    assert [name for name, *_ in local["files"]] == ["chart.png", "out/report.csv"]


def test_a_sandboxed_code_skill_runs_on_the_server_from_the_code_it_was_sent(
        server: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An `@skill(sandbox=True)` of an agent defined in Python runs on the server: its package travels with
    the call, the harness package is the server's own, and what it finds there is what the local sandbox
    shows it (no secret of the harness process, none of its files)."""
    url, token = server
    monkeypatch.setenv("HARNESS_SANDBOX_TOKEN", token)
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    db = tmp_path / "harness.db"
    for name, text in (("rules.yaml", _rules([str(db)])), ("p.cedar", CEDAR), ("policy.yaml", POLICY),
                       ("ids.yaml", IDENTITIES)):
        (tmp_path / name).write_text(text)
    agent = Agent(name="pry", instructions="Pry.", skills=[pry_sandboxed, pry_in_process],
                  policy=tmp_path / "policy.yaml", identities=tmp_path / "ids.yaml", llm_rules=tmp_path / "rules.yaml")
    with Harness(agent, db=str(db), data_dir=tmp_path / "data", sandbox="bwrap", sandbox_provider="remote",
                 sandbox_url=url) as h:
        done = h.run("pry sandboxed", user="ana")
        assert done.state == "SUCCEEDED", done.error
        found = done.artifacts["found"]
        assert found["env"] == {name: False for name in SECRETS}
        assert found["files"] == {str(db): "FileNotFoundError"}
        (tool,) = [t.data for t in h.trace(done.run_id) if t.kind == "tool"]
        assert (tool["call_kind"], tool["isolation"], tool["sandbox_provider"]) == ("sandbox", "bwrap", "remote")
