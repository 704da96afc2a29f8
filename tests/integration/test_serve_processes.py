"""`harness serve --processes 2`: two service processes behind one port, started, restarted and ended by
their supervisor (SPEC D1, K5b, U1, U2).

Real processes, real HTTP, every backend. The Runs accepted through the one port are driven by both
processes; a process SIGKILLed is started again and its Runs are finished, none twice; the processes end
with the supervisor, even one SIGKILLed; one session secret signs the console's cookies in both; and a
process that cannot start stops the command with the one-line error `serve` gives, exit code 2.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from harness.adapters.sql.reconcile_reads import SqlReconcileReads
from harness.adapters.sql.store import SqlStore
from harness.audit.reconcile import reconcile
from harness.service.processes import START_FAILED

from .test_service_replicas import FINAL_STATES, _free_port, _key, calls, service_env

pytestmark = pytest.mark.slow


def _children(pid: int) -> set[int]:
    """The service processes a supervisor started (not multiprocessing's resource tracker)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _serving(url: str, supervisor: subprocess.Popen[bytes], log: Path, processes: int,
             timeout_s: float = 90) -> set[int]:
    """Wait until `processes` service processes answer behind the port; their pids."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert supervisor.poll() is None, log.read_text()[-3000:]
        kids = _children(supervisor.pid)
        started = log.read_text().count("Application startup complete")
        if len(kids) == processes and started >= processes:
            try:
                if httpx.get(f"{url}/health", headers=_key("dan"), timeout=2).status_code == 200:
                    return kids
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"{processes} service processes did not come up: {log.read_text()[-3000:]}")


@pytest.fixture
def supervisor(backend_url: str, tmp_path: Path, call_log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str,
                                                                                   Path]]:
    """`harness serve --processes 2` on a database nobody migrated, without a configured session secret."""
    env = service_env(tmp_path, call_log)
    del env["HARNESS_SESSION_SECRET"]
    port, log = _free_port(), tmp_path / "serve.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "serve", "--port", str(port), "--db",
                                 backend_url, "--processes", "2"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc, f"http://127.0.0.1:{port}", log
    finally:
        for pid in [proc.pid, *_children(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)


def _submit(url: str, first: int, count: int) -> list[str]:
    """`count` echo Runs, each on a connection of its own (so the kernel hands them to either process)."""
    def one(i: int) -> str:
        for _ in range(100):
            try:
                answer = httpx.post(f"{url}/api/v1/runs", json={"task": f"echo run {i}", "idempotency_key": f"k{i}"},
                                    headers=_key(f"u{i % 40}"), timeout=20)
            except httpx.HTTPError:  # a process killed with the connection open: the client tries again
                time.sleep(0.1)
                continue
            assert answer.status_code in (200, 202), answer.text
            return str(answer.json()["run_id"])
        raise AssertionError(f"Run {i} was not accepted")

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(first, first + count)))


def _final(store: SqlStore, run_ids: list[str], timeout_s: float = 120) -> Counter[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = Counter(store.get_run(r).state.value for r in run_ids)
        if set(states) <= FINAL_STATES:
            return states
        time.sleep(0.3)
    raise AssertionError(f"not final in {timeout_s:.0f} s: {states}")


def _drivers(call_log: Path) -> set[int]:
    """The processes that ran the echo skill so far (its own pid, or its parent's when a sandbox ran it)."""
    return {pid for c in calls(call_log) if c["skill"] == "test.echo" for pid in c.get("pids", ())}


def test_two_processes_drive_the_runs_of_one_port_and_end_with_their_supervisor(
        supervisor: tuple[subprocess.Popen[bytes], str, Path], backend_url: str, call_log: Path) -> None:
    proc, url, log = supervisor
    pair = _serving(url, proc, log, 2)
    secrets = {dict(v.split(b"=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v)
               .get(b"HARNESS_SESSION_SECRET") for pid in pair}
    assert len(secrets) == 1 and None not in secrets, "both processes sign console sessions with one secret"

    store = SqlStore.open(backend_url)
    try:
        run_ids: list[str] = []
        while not pair <= _drivers(call_log) and len(run_ids) < 240:  # the kernel spreads connections
            run_ids += _submit(url, len(run_ids), 40)
            assert _final(store, run_ids) == Counter({"SUCCEEDED": len(run_ids)})
        assert pair <= _drivers(call_log), f"one process drove every Run: {_drivers(call_log)}"

        # a process killed under load is started again, and the Runs it held are finished by a live one
        more = _submit(url, len(run_ids), 10)
        victim = next(iter(pair))
        os.kill(victim, signal.SIGKILL)
        more += _submit(url, len(run_ids) + 10, 30)
        renewed = _serving(url, proc, log, 2)
        assert victim not in renewed and len(renewed & pair) == 1
        states = _final(store, more)
        unknown = [r for r in more if store.get_run(r).state.value == "CLOSED_FAILED"
                   and "unknown" in str((store.get_run(r).result or {}).get("error"))]
        assert states["SUCCEEDED"] + len(unknown) == len(more), states
        keys = Counter(c["key"] for c in calls(call_log))
        assert all(n == 1 for n in keys.values()), keys.most_common(3)
        store.drain_all()
        assert reconcile(SqlReconcileReads(store)).ok
    finally:
        store.close()

    # the supervisor SIGKILLed: its processes are told by the kernel, and end
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in renewed):
        time.sleep(0.2)
    assert not any(_alive(p) for p in renewed), "a service process outlived its supervisor"


def test_an_unreachable_database_stops_the_command_before_any_process_starts(tmp_path: Path) -> None:
    """One line naming it, no traceback, exit code 2: the schema is checked (and a new one made) before the
    processes start, so none is started to fail."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    argv = [sys.executable, "-m", "harness.cli", "serve", "--port", str(_free_port()), "--processes", "2", "--db",
            "postgresql://nobody@127.0.0.1:1/none"]
    done = subprocess.run(argv, env={**env, "HARNESS_DATA_DIR": str(tmp_path / "data")}, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "error: database error" in done.stderr and "127.0.0.1" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.count("error: database error") == 1
    assert "harness service on" not in done.stderr, "processes were started"


def test_a_process_that_cannot_start_stops_the_command_with_the_reason(tmp_path: Path) -> None:
    """A policy file that does not parse (read by each process as it builds its runtime): one line naming it,
    no traceback, exit code 2, and no process restarted."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    broken = tmp_path / "broken.cedar"
    broken.write_text("permit(principal, action, resource) when { nonsense", encoding="utf-8")
    argv = [sys.executable, "-m", "harness.cli", "serve", "--port", str(_free_port()), "--processes", "2", "--db",
            str(tmp_path / "harness.db")]
    done = subprocess.run(argv, env={**env, "HARNESS_DATA_DIR": str(tmp_path / "data"),
                                     "HARNESS_POLICY_FILE": str(broken)},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"error: {broken}" in done.stderr, done.stderr[-3000:]
    assert "the service could not start" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.count(f"error: {broken}") == 1, "the failed process was started again"


def test_the_start_failure_code_is_the_one_uvicorn_does_not_restart() -> None:
    from uvicorn.config import STARTUP_FAILURE

    assert START_FAILED == STARTUP_FAILURE
