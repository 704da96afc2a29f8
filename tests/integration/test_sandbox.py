"""Sandboxed skills (SPEC T4, T5): escape attempts are contained and traced, the rlimit fallback says it
is weaker, the Run's working directory lives as long as the Run, and the bundled shell.exec shows it.

The bubblewrap tests run when bwrap works on this machine; otherwise they skip with the reason —
or fail, when HARNESS_REQUIRE_SERVICES=1 (CI installs bubblewrap, and a silent skip would hide it).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from harness.adapters.sandbox import select_sandbox
from harness.adapters.sandbox.bwrap import identity_for, unavailable_reason
from harness.adapters.sandbox.rlimit import RlimitSandbox
from harness.adapters.sandbox.workdirs import Workdirs
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.contracts import CallerIdentity
from harness.domain.errors import InvalidRequestError
from harness.examples.support import EXAMPLE_DIR
from harness.policy.config import Guardrail
from harness.policy.guardrails import matches
from harness.settings import Settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
Tasks = dict[str, tuple[str, dict[str, Any]]]  # task text -> (skill id, arguments) of its one-step plan
Mode = Literal["bwrap", "rlimit"]

SKILLS = '''
import os, signal, socket, time
from pathlib import Path

def connect(args, ctx):
    with socket.create_connection(("127.0.0.1", args["port"]), timeout=2) as conn:
        conn.sendall(b"hello")
    return {"connected": True}

def write_outside(args, ctx):
    (Path(ctx.workdir) / "inside.txt").write_text("mine")
    Path(args["path"]).write_text("escaped")

def look_around(args, ctx):
    return {"siblings": sorted(os.listdir(Path(ctx.workdir).parent)), "uid": os.getuid()}

def fork_bomb(args, ctx):
    while True:
        os.fork()

def memory_hog(args, ctx):
    hoard = []
    while True:
        hoard.append(bytearray(32 * 1024 * 1024))

def spin(args, ctx):
    while True:
        pass

def nap(args, ctx):
    time.sleep(args["seconds"])
    return {"slept": args["seconds"]}

def crash(args, ctx):
    os.kill(os.getpid(), signal.SIGSEGV)

def note(args, ctx):
    path = Path(ctx.workdir) / "note.txt"
    before = path.read_text() if path.exists() else ""
    path.write_text(before + args["text"])
    return {"note": path.read_text()}
'''

# skill id -> (function, extra manifest fields)
SANDBOXED: dict[str, tuple[str, dict[str, Any]]] = {
    "test.sbx_connect": ("connect", {}),
    "test.sbx_connect_net": ("connect", {"network": True}),
    "test.sbx_write": ("write_outside", {}),
    "test.sbx_look": ("look_around", {}),
    "test.sbx_fork": ("fork_bomb", {"limits": {"processes": 16}}),
    "test.sbx_hog": ("memory_hog", {"limits": {"memory_mb": 128}}),
    "test.sbx_spin": ("spin", {"limits": {"cpu_s": 1}}),
    "test.sbx_nap": ("nap", {"timeout_s": 0.5}),
    "test.sbx_crash": ("crash", {}),
    "test.sbx_note": ("note", {}),
}


def write_skills(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sbx.py").write_text(SKILLS)
    for skill_id, (function, extra) in SANDBOXED.items():
        manifest = {"id": skill_id, "version": "1.0.0", "entrypoint": f"sbx.py:{function}",
                    "input_schema": {"type": "object"}, "risk": {"access": "read"}, "timeout_s": 10,
                    "sandbox": True, **extra}
        (folder / f"{skill_id.split('.')[1]}.yaml").write_text(yaml.safe_dump(manifest))


def write_rules(path: Path, tasks: Tasks) -> None:
    rules = [{"name": name, "when": f"^{re.escape(name)}$", "plan": {"steps": [
        {"id": "a", "tool_call": {"skill": skill, "arguments": args}, "output_key": "a"}]}}
        for name, (skill, args) in tasks.items()]
    path.write_text(yaml.safe_dump({"rules": rules}))


def sandbox_runtime(tmp_path: Path, clock: FakeClock, mode: Mode, tasks: Tasks) -> Runtime:
    write_skills(tmp_path / "skills")
    write_rules(tmp_path / "rules.yaml", tasks)
    settings = Settings(db=str(tmp_path / "rt.db"), skills_dirs=(tmp_path / "skills",),
                        policy_file=FIXTURES / "policy.yaml", llm_rules=tmp_path / "rules.yaml",
                        identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data",
                        sandbox=mode)
    return build_runtime(settings, clock=clock)


def need_bwrap() -> None:
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("HARNESS_REQUIRE_SERVICES") == "1":
            pytest.fail(f"bubblewrap is required here but unusable: {reason}")
        pytest.skip(f"bubblewrap unusable on this machine: {reason}")


class Listener:
    """A loopback TCP server that records whatever connects to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                self.received.append(conn.recv(100))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    """A loopback server on the host."""
    server = Listener()
    yield server
    server.close()


def tool_and_errors(rt: Runtime, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rt.store.drain_all()
    records = rt.store.trace_of(run_id)
    return ([r.data() for r in records if r.kind == "tool"], [r.data() for r in records if r.kind == "error"])


def processes_of(uid: int) -> list[int]:
    """Live processes whose real uid is `uid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            match = re.search(r"^Uid:\s+(\d+)", status, re.M)
            if match and int(match.group(1)) == uid:
                found.append(int(entry.name))
    return found


def assert_contained(rt: Runtime, task: str, code: str, isolation: str = "bwrap") -> str:
    """The Run failed with the named error, traced in a ToolTrace and an ErrorTrace."""
    result = rt.runs.create_run({"task": task, **TESTER})
    assert result.state == "CLOSED_FAILED", result
    assert code in (result.error or "")
    tools, errors = tool_and_errors(rt, result.run_id)
    assert [(t["call_kind"], t["isolation"], t["error_code"]) for t in tools] == [
        ("sandbox", isolation, code)]
    assert any(e["error_code"] == code for e in errors)
    return result.run_id


ESCAPES: Tasks = {
    "write": ("test.sbx_write", {}),
    "fork": ("test.sbx_fork", {}),
    "hog": ("test.sbx_hog", {}),
    "spin": ("test.sbx_spin", {}),
    "nap": ("test.sbx_nap", {"seconds": 5}),
    "crash": ("test.sbx_crash", {}),
    "look": ("test.sbx_look", {}),
}


@pytest.fixture
def bwrap_rt(tmp_path: Path, clock: FakeClock) -> Iterator[Runtime]:
    """A runtime whose sandbox must be bubblewrap."""
    need_bwrap()
    tasks: Tasks = {**ESCAPES, "write": ("test.sbx_write", {"path": str(tmp_path / "outside.txt")})}
    rt = sandbox_runtime(tmp_path, clock, "bwrap", tasks)
    yield rt
    rt.close()


def test_network_is_cut_unless_declared(tmp_path: Path, clock: FakeClock, listener: Listener) -> None:
    """Without `network: true` a sandboxed skill cannot reach even the host's loopback; with it, it can."""
    need_bwrap()
    rt = sandbox_runtime(tmp_path, clock, "bwrap", {
        "cut": ("test.sbx_connect", {"port": listener.port}),
        "open": ("test.sbx_connect_net", {"port": listener.port}),
    })
    try:
        assert_contained(rt, "cut", "sandbox_network_denied")
        assert listener.received == []
        opened = rt.runs.create_run({"task": "open", **TESTER})
        assert opened.state == "SUCCEEDED", opened.error
        assert listener.received == [b"hello"]
    finally:
        rt.close()


def test_writing_outside_the_workdir_is_refused(bwrap_rt: Runtime, tmp_path: Path) -> None:
    """A skill can write in its Run's directory but not beside it; the host file never appears."""
    assert_contained(bwrap_rt, "write", "sandbox_fs_denied")
    assert not (tmp_path / "outside.txt").exists()


def test_other_runs_directories_are_invisible(bwrap_rt: Runtime) -> None:
    """Inside the sandbox, the workdir root holds only the Run's own folder, and the skill is not root."""
    first = bwrap_rt.runs.create_run({"task": "look", **TESTER})
    second = bwrap_rt.runs.create_run({"task": "look", **TESTER})
    assert first.state == second.state == "SUCCEEDED"
    assert second.artifacts["a"]["siblings"] == [second.run_id]
    assert second.artifacts["a"]["uid"] == identity_for(second.run_id)[0] != 0


def test_fork_bomb_is_capped_and_leaves_nothing_behind(bwrap_rt: Runtime) -> None:
    """A fork bomb hits the process limit, fails its Run, and no process of it survives the call."""
    run_id = assert_contained(bwrap_rt, "fork", "sandbox_process_limit")
    assert processes_of(identity_for(run_id)[0]) == []


def test_memory_hog_is_stopped_by_its_memory_limit(bwrap_rt: Runtime) -> None:
    """Allocating past memory_mb fails the Run with sandbox_memory_limit, not the harness."""
    assert_contained(bwrap_rt, "hog", "sandbox_memory_limit")


def test_infinite_loop_is_stopped_by_its_cpu_limit(bwrap_rt: Runtime) -> None:
    """A busy loop is killed at its CPU limit and named as such."""
    assert_contained(bwrap_rt, "spin", "sandbox_cpu_limit")


def test_wall_time_kill_times_the_run_out(bwrap_rt: Runtime) -> None:
    """A call past its timeout is killed with its processes; the Run ends TIMEOUT -> CLOSED_FAILED."""
    result = bwrap_rt.runs.create_run({"task": "nap", **TESTER})
    assert list(result.path)[-3:] == ["TIMEOUT", "TRACING", "CLOSED_FAILED"]
    tools, errors = tool_and_errors(bwrap_rt, result.run_id)
    assert tools[0]["error_code"] == "timeout" and errors[0]["error_code"] == "timeout"
    assert processes_of(identity_for(result.run_id)[0]) == []


def test_a_crash_fails_only_its_own_run(bwrap_rt: Runtime) -> None:
    """A segfaulting skill fails its Run; the harness goes on and the next Run succeeds."""
    run_id = assert_contained(bwrap_rt, "crash", "sandbox_crashed")
    assert bwrap_rt.store.get_run(run_id).state.value == "CLOSED_FAILED"
    assert bwrap_rt.runs.create_run({"task": "look", **TESTER}).state == "SUCCEEDED"


def test_rlimit_fallback_is_loud_and_still_bounds_resources(tmp_path: Path, clock: FakeClock,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The fallback logs that it is weaker, traces isolation "rlimit", and still stops memory and CPU."""
    rt = sandbox_runtime(tmp_path, clock, "rlimit", ESCAPES)
    try:
        with caplog.at_level(logging.WARNING, logger="harness.sandbox"):
            assert_contained(rt, "hog", "sandbox_memory_limit", isolation="rlimit")
        assert "no network isolation" in caplog.text
        assert_contained(rt, "spin", "sandbox_cpu_limit", isolation="rlimit")
        result = rt.runs.create_run({"task": "nap", **TESTER})
        assert list(result.path)[-3:] == ["TIMEOUT", "TRACING", "CLOSED_FAILED"]
    finally:
        rt.close()


def test_rlimit_warning_names_what_is_missing(caplog: pytest.LogCaptureFixture) -> None:
    """Choosing the fallback warns that network and filesystem are not isolated."""
    with caplog.at_level(logging.WARNING, logger="harness.sandbox"):
        sandbox = RlimitSandbox()
    assert sandbox.isolation == "rlimit"
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "no network isolation" in message and "no filesystem isolation" in message


def test_missing_bwrap_falls_back_or_refuses(monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """Without bwrap on PATH, "auto" falls back to rlimit with a warning and "bwrap" is refused."""
    monkeypatch.setenv("PATH", "/nonexistent")
    unavailable_reason.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="harness.sandbox"):
            assert select_sandbox("auto").isolation == "rlimit"
        assert "not installed" in caplog.text
        with pytest.raises(InvalidRequestError, match="bwrap"):
            select_sandbox("bwrap")
    finally:
        unavailable_reason.cache_clear()


def test_workdir_lives_while_the_run_waits_and_goes_when_final(tmp_path: Path, clock: FakeClock) -> None:
    """The Run's directory is kept through AWAITING_HITL, shared by its sandboxed steps, then removed."""
    write_skills(tmp_path / "skills")
    manifest = tmp_path / "skills" / "sbx_note.yaml"
    manifest.write_text(manifest.read_text().replace("access: read", "access: write\n  space: project"))
    write_rules(tmp_path / "rules.yaml", {})
    rules = yaml.safe_load((tmp_path / "rules.yaml").read_text())
    rules["rules"] = [{"name": "notes", "when": "^notes$", "plan": {"steps": [
        {"id": "a", "tool_call": {"skill": "test.sbx_note", "arguments": {"text": "one"}}, "output_key": "a"},
        {"id": "b", "tool_call": {"skill": "test.sbx_note", "arguments": {"text": "two"}}, "output_key": "b",
         "depends_on": ["a"]}]}}]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    rt = build_runtime(Settings(db=str(tmp_path / "rt.db"), skills_dirs=(tmp_path / "skills",),
                                policy_file=FIXTURES / "policy.yaml", llm_rules=tmp_path / "rules.yaml",
                                identities_file=FIXTURES / "identities.yaml", data_dir=tmp_path / "data"),
                       clock=clock)
    try:
        parked = rt.runs.create_run({"task": "notes", **TESTER})
        assert parked.state == "AWAITING_HITL"
        held = rt.tools.workdirs.ensure(parked.run_id)  # e.g. what an earlier call of the Run left there
        (held / "note.txt").write_text("zero,")
        assert held.exists()
        _, done = rt.runs.decide(parked.approval_request_id or "", CallerIdentity(**TESTER), "approve")
        assert done.state == "SUCCEEDED", done.error
        assert done.artifacts["b"]["note"] == "zero,onetwo"
        assert not held.exists()
    finally:
        rt.close()


EXAMPLE_GUARDRAILS = yaml.safe_load((EXAMPLE_DIR / "policy.yaml").read_text())["guardrails"]
GUARD = Guardrail.model_validate(next(g for g in EXAMPLE_GUARDRAILS if g["id"] == "no_wiping_the_root"))


@pytest.mark.parametrize(("command", "blocked"), [
    ("rm -rf /", True), ("rm -fr /*", True), ("cd x && rm -r -f / --no-preserve-root", True),
    ("rm --recursive --force /", True), ("rm -rf /tmp/scratch", False), ("ls -la /", False),
    ("rm -rf build", False),
])
def test_shell_guardrail_pattern(command: str, blocked: bool) -> None:
    """The example's guardrail refuses wiping / in its usual spellings and lets ordinary commands by."""
    assert matches(GUARD, command) is blocked  # the full table is in tests/unit/test_shell_guardrail.py


@pytest.fixture
def shell_rt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    """The bundled support example with a rule that asks the shell to run a command."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rules = {"rules": [{"name": "shell", "when": "^run: (?P<command>.+)$", "plan": {"steps": [
        {"id": "sh", "tool_call": {"skill": "shell.exec", "arguments": {"command": "{command}"}},
         "output_key": "shell"}], "answer_template": "{shell.stdout}"}}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    rt = build_runtime(Settings(db=str(tmp_path / "support.db"), data_dir=tmp_path / "data",
                                llm_rules=tmp_path / "rules.yaml"))
    yield rt
    rt.close()


OPERATOR = {"tenant_id": "default", "user_id": "operator", "roles": ["operator", "support_agent"]}


def test_shell_exec_runs_sandboxed_after_confirmation(shell_rt: Runtime) -> None:
    """An operator's shell command waits for their L2 confirmation, then runs in the sandbox."""
    parked = shell_rt.runs.create_run({"task": "run: echo hello > f.txt && cat f.txt && pwd", **OPERATOR})
    assert parked.state == "AWAITING_HITL"
    assert shell_rt.hitl.get(parked.approval_request_id or "").level == "L2"
    _, done = shell_rt.runs.decide(parked.approval_request_id or "", CallerIdentity(**OPERATOR), "approve")
    assert done.state == "SUCCEEDED", done.error
    lines = (done.answer or "").splitlines()
    assert lines[0] == "hello" and lines[1].endswith(parked.run_id)
    tools, _ = tool_and_errors(shell_rt, done.run_id)
    assert tools[0]["call_kind"] == "sandbox" and tools[0]["isolation"] in ("bwrap", "rlimit")


def test_shell_exec_refuses_rm_rf_root_and_non_operators(shell_rt: Runtime) -> None:
    """`rm -rf /` is rejected by the guardrail before any execution; a support agent may not use the shell."""
    wipe = shell_rt.runs.create_run({"task": "run: rm -rf /", **OPERATOR})
    assert wipe.state == "CLOSED_REJECTED" and "no_wiping_the_root" in (wipe.error or "")
    agent = shell_rt.runs.create_run({"task": "run: ls", "user_id": "alice", "roles": ["support_agent"]})
    assert agent.state == "CLOSED_REJECTED" and "permission" in (agent.error or "")


def test_a_run_id_cannot_name_a_folder_outside_the_root(tmp_path: Path) -> None:
    """Workdir paths come only from safe run ids; removal of an unsafe one is a no-op, never an error."""
    workdirs = Workdirs(tmp_path / "runs")
    (tmp_path / "precious").mkdir()
    for bad in ("../precious", "..", "a/b", ""):
        with pytest.raises(ValueError, match="run id"):
            workdirs.path(bad)
        assert workdirs.remove(bad) is False
    assert (tmp_path / "precious").exists()
    assert workdirs.ensure("run-1").stat().st_mode & 0o777 == 0o700
