"""An MCP call waits without a thread: Runs driven by the service's worker (a drive loop) that each call a
real MCP server over streamable HTTP (tests/fixtures/mcp/pause_server.py, on loopback) all have their calls
in flight at once, though no lane has a thread for them, and every Run succeeds."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from harness.config import build_runtime
from harness.domain.contracts import RunRequest
from harness.service.worker import Admission, EmbeddedWorker
from harness.settings import Settings

from .test_mcp_skills import FIXTURES, MCP, _free_port

RUNS = 40


def _pause_server() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(MCP / "pause_server.py"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}/mcp"


def test_runs_waiting_on_an_mcp_server_hold_no_thread(tmp_path: Path) -> None:
    """40 Runs each pausing 2 s on the MCP server, through a worker whose lanes have one thread each: the
    server sees all 40 calls at once, and each Run's trace records its call once."""
    proc, url = _pause_server()
    try:
        _wait_listening(proc, url)
        (tmp_path / "mcp.yaml").write_text(json.dumps({"servers": {"pause": {
            "url": url, "tools": {"pause": {"risk": {"access": "read"}, "idempotent": True, "timeout_s": 30}}}}}))
        (tmp_path / "rules.yaml").write_text(
            "rules:\n  - name: pause\n    when: '^pause (?P<seconds>[\\d.]+) \\((?P<n>\\d+)\\)$'\n    plan:\n"
            "      steps:\n        - {id: p, tool_call: {skill: pause.pause,"
            " arguments: {seconds: \"{seconds:number}\"}}, output_key: p}\n      answer_template: \"{p.paused}\"\n")
        (tmp_path / "policies.cedar").write_text(
            'permit (principal in Role::"tester", action == Action::"call", resource in SkillGroup::"pause");\n')
        (tmp_path / "policy.yaml").write_text("version: 1\npermissions:\n  cedar: policies.cedar\n"
                                              "budgets:\n  per_run_usd: 1.0\n")
        (tmp_path / "no-skills").mkdir()
        runtime = build_runtime(Settings(
            db=str(tmp_path / "mcp.db"), skills_dirs=(tmp_path / "no-skills",), policy_file=tmp_path / "policy.yaml",
            llm_rules=tmp_path / "rules.yaml", identities_file=FIXTURES / "identities.yaml",
            data_dir=tmp_path / "data", mcp_file=tmp_path / "mcp.yaml", memory="off",
            local_skill_threads=1, sandbox_threads=1, llm_threads=1))
        worker = EmbeddedWorker(runtime, concurrency=1000, housekeeping_interval_s=3600)
        threads_before = set(threading.enumerate())
        try:
            futures = []
            for i in range(RUNS):
                run, _ = runtime.runs.submit(RunRequest(task=f"pause 2 ({i})", tenant_id="t1", user_id="tess"))
                futures.append((run.run_id, worker.drive(run.run_id, Admission())))
            for _, future in futures:
                future.result(120)
            results = [runtime.runs.result(run_id) for run_id, _ in futures]
            assert {r.state for r in results} == {"SUCCEEDED"}, [(r.state, r.error) for r in results]
            peaks = {r.artifacts["p"]["peak"] for r in results}
            assert max(peaks) == RUNS  # every call waited at the server at once
            # not a thread per waiting call: what this worker started (its loop, lanes, drain) is a handful,
            # whatever threads earlier tests left in this process
            started = [t.name for t in set(threading.enumerate()) - threads_before]
            assert len(started) < RUNS // 2, started
            runtime.store.drain_all()
            for r in results:
                assert len([t for t in runtime.store.trace_of(r.run_id) if t.kind == "tool"]) == 1
        finally:
            worker.stop()
            runtime.close()
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_listening(proc: subprocess.Popen[bytes], url: str) -> None:
    import socket
    import time

    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            assert proc.poll() is None, "the pause server exited at start"
            time.sleep(0.05)
    raise AssertionError("the pause server did not start listening")
