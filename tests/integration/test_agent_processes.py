"""An agent defined in Python is parked, approved and driven by other OS processes (issue 38): a script
using `Harness` parks its Runs; `harness --agent module:attr approve`, and `harness serve --agent
module:attr` over HTTP, approve them and the Runs succeed. A process without the agent refuses to approve
(exit 1, naming the missing skill) before anything is recorded: the Run stays AWAITING_HITL, its request
pending, for the right process to approve later; with --no-resume it records the decision and leaves the
drive to a process that has the agent.

Real processes on one database, on every backend. The agent is tests/fakes/ops_agent.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.adapters.sql.approvals import SqlApprovals
from harness.adapters.sql.store import SqlStore

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
OPS = "tests.fakes.ops_agent:ops"
CAROL = {"Authorization": "Bearer demo-carol-key"}  # a support lead of the bundled identities

PARK = """
import json, sys
from harness import Harness
from tests.fakes.ops_agent import TASK, ops
with Harness(ops, db=sys.argv[1]) as h:
    runs = [h.run(TASK, user="alice") for _ in range(int(sys.argv[2]))]
print(json.dumps([{"run_id": r.run_id, "request_id": r.approval_request_id, "state": r.state} for r in runs]))
"""


@pytest.fixture
def env(tmp_path: Path, call_log: Path) -> dict[str, str]:
    """The environment of every process: this tree's code and the repository's root (the agent's module)
    importable, no agent named, the skill's call log, short re-drive and housekeeping for `serve`."""
    base = {k: v for k, v in os.environ.items() if k not in ("HARNESS_AGENT", "HARNESS_DATABASE_URL")}
    return {**base, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "HARNESS_DATA_DIR": str(tmp_path / "data"), "HARNESS_TEST_CALL_LOG": str(call_log),
            "HARNESS_REDRIVE_GRACE_S": "0.3", "HARNESS_HOUSEKEEPING_S": "0.2",
            "HARNESS_SESSION_SECRET": "agent-secret-agent-secret"}


def park(env: dict[str, str], db: str, cwd: Path, count: int = 1) -> list[dict[str, Any]]:
    """Park `count` Runs of the ops agent in a process of their own (a script using `Harness`)."""
    done = subprocess.run([sys.executable, "-c", PARK, db, str(count)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    runs: list[dict[str, Any]] = json.loads(done.stdout)
    assert [r["state"] for r in runs] == ["AWAITING_HITL"] * count, runs
    return runs


def harness(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`harness ARGS` as its own process."""
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)


def state_of(db: str, run_id: str, request_id: str) -> tuple[str, str]:
    """The Run's state and its approval request's status, as the database holds them."""
    store = SqlStore.open(db)
    try:
        request = SqlApprovals(store).get(request_id)
        assert request is not None
        return store.get_run(run_id).state.value, request.status
    finally:
        store.close()


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_cli_approves_a_python_agents_run_only_with_the_agent(backend_url: str, env: dict[str, str],
                                                                  tmp_path: Path, call_log: Path) -> None:
    """A Run parked by a script's `Harness(ops)`: `harness approve` without the agent exits 1 naming the
    missing skill and records nothing (the Run is still AWAITING_HITL, its request pending, the skill never
    ran); `harness --agent tests.fakes.ops_agent:ops approve` then approves it and the Run succeeds."""
    (run,) = park(env, backend_url, tmp_path)
    refused = harness(env, tmp_path, "approve", run["request_id"], "--as", "carol", "--db", backend_url, "--json")
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "ops.restart" in refused.stderr and "missing" in refused.stderr and "Traceback" not in refused.stderr
    assert state_of(backend_url, run["run_id"], run["request_id"]) == ("AWAITING_HITL", "pending")
    assert calls(call_log) == []

    approved = harness(env, tmp_path, "--agent", OPS, "approve", run["request_id"], "--as", "carol",
                       "--db", backend_url, "--json")
    assert approved.returncode == 0, approved.stderr
    decided = json.loads(approved.stdout)
    assert decided["accepted"] is True and decided["run"]["state"] == "SUCCEEDED", decided
    assert decided["run"]["answer"] == "restarted billing"
    assert [c["service"] for c in calls(call_log)] == ["billing"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(backend_url: str, env: dict[str, str], tmp_path: Path, *agent: str) -> Iterator[tuple[str, Path]]:
    """`harness serve [--agent ...]` on the test database; its URL and log."""
    SqlStore.open(backend_url).close()  # migrated before the parking script and the service both open it
    port = _free_port()
    log = tmp_path / f"serve-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "serve", *agent, "--port", str(port),
                                 "--db", backend_url], env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"harness serve did not come up: {log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{url}/health", headers=CAROL, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def served(backend_url: str, env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """`harness serve --agent tests.fakes.ops_agent:ops` on the test database; its URL."""
    with serving(backend_url, env, tmp_path, "--agent", OPS) as (url, _):
        yield url


def wait_for(url: str, run_id: str, states: set[str], timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        doc: dict[str, Any] = httpx.get(f"{url}/api/v1/runs/{run_id}", headers=CAROL, timeout=5).json()
        if doc.get("state") in states or time.monotonic() > deadline:
            return doc
        time.sleep(0.2)


def test_serve_with_a_python_agent_approves_over_http_and_drives_a_no_resume_approval(
        backend_url: str, served: str, env: dict[str, str], tmp_path: Path, call_log: Path) -> None:
    """Two Runs parked by a script's `Harness(ops)`. The first is approved over HTTP on `harness serve
    --agent tests.fakes.ops_agent:ops` and succeeds; the second is approved by a CLI process without the
    agent with --no-resume (the decision recorded, not driven there) and the service drives it to success."""
    first, second = park(env, backend_url, tmp_path, count=2)
    decided = httpx.post(f"{served}/api/v1/approvals/{first['request_id']}/decision",
                         json={"decision": "approve", "reason": "go"}, headers=CAROL,
                         params={"wait": "true", "timeout": 30}, timeout=40)
    assert decided.status_code == 200, decided.text
    assert decided.json()["accepted"] is True
    assert wait_for(served, first["run_id"], {"SUCCEEDED"})["state"] == "SUCCEEDED"

    recorded = harness(env, tmp_path, "approve", second["request_id"], "--as", "carol", "--no-resume",
                       "--db", backend_url, "--json")
    assert recorded.returncode == 0, recorded.stderr
    doc = json.loads(recorded.stdout)
    assert doc["accepted"] is True and doc["run"]["state"] == "EXECUTING", doc  # not driven by the CLI
    done = wait_for(served, second["run_id"], {"SUCCEEDED", "CLOSED_FAILED"})
    assert done["state"] == "SUCCEEDED", done
    assert sorted(c["key"] for c in calls(call_log)) == sorted(f"{r['run_id']}:restart" for r in (first, second))


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_worker_with_the_agent_drives_a_run_approved_without_it(env: dict[str, str], tmp_path: Path,
                                                                  call_log: Path) -> None:
    """`harness worker --agent tests.fakes.ops_agent:ops --beat` on a private broker; a Run parked by a
    script, approved by a CLI process without the agent with --no-resume (recorded, left in EXECUTING):
    the worker's sweep picks it up and drives it to success, the skill run once (SQLite)."""
    db = str(tmp_path / "ops.db")
    port = _free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    environ = {**env, "HARNESS_BROKER_URL": f"redis://127.0.0.1:{port}/0", "HARNESS_LEASE_TTL_S": "2",
               "HARNESS_SWEEP_INTERVAL_S": "1", "HARNESS_CHECKPOINT_INTERVAL_S": "0"}
    log = tmp_path / "worker.log"
    worker = None
    try:
        (run,) = park(environ, db, tmp_path)
        with log.open("wb") as out:
            worker = subprocess.Popen([sys.executable, "-m", "harness.cli", "worker", "--agent", OPS, "--beat",
                                       "--db", db], env=environ, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        recorded = harness(environ, tmp_path, "approve", run["request_id"], "--as", "carol", "--no-resume",
                           "--db", db, "--json")
        assert recorded.returncode == 0, recorded.stderr
        assert json.loads(recorded.stdout)["run"]["state"] == "EXECUTING"
        deadline = time.monotonic() + 90
        while state_of(db, run["run_id"], run["request_id"])[0] == "EXECUTING":
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"the worker did not drive it: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        assert state_of(db, run["run_id"], run["request_id"]) == ("SUCCEEDED", "approved")
        assert [c["key"] for c in calls(call_log)] == [f"{run['run_id']}:restart"]
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
        redis.kill()
        redis.wait()


def test_a_service_without_the_agent_leaves_an_approved_run_to_one_that_has_it(
        backend_url: str, env: dict[str, str], tmp_path: Path, call_log: Path) -> None:
    """A Run of the ops agent approved with --no-resume while only a `harness serve` of another agent (the
    bundled example) runs on the database: that service does not fail it (today's "not in the approved
    plan"), it leaves it in EXECUTING and says why in its log; a service with the agent then drives it to
    success, the skill run once."""
    (run,) = park(env, backend_url, tmp_path)
    with serving(backend_url, env, tmp_path) as (other, log):
        recorded = harness(env, tmp_path, "approve", run["request_id"], "--as", "carol", "--no-resume",
                           "--db", backend_url, "--json")
        assert recorded.returncode == 0, recorded.stderr
        deadline = time.monotonic() + 30
        while "was not driven here" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "ops.restart" in log.read_text(), log.read_text()[-3000:]
        time.sleep(1.0)  # several housekeeping passes (0.2 s) later
        assert wait_for(other, run["run_id"], set(), timeout_s=0)["state"] == "EXECUTING"
        assert calls(call_log) == []
    with serving(backend_url, env, tmp_path, "--agent", OPS) as (url, _):
        done = wait_for(url, run["run_id"], {"SUCCEEDED", "CLOSED_FAILED"})
        assert done["state"] == "SUCCEEDED", done
    assert [c["key"] for c in calls(call_log)] == [f"{run['run_id']}:restart"]
