"""Workers drive Runs under leases: exclusive, fenced when taken over, honest after a crash (K5b, T6, S1)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.drive.worker import RunWorker
from harness.kernel.states import RunState
from harness.settings import Settings

from ..conftest import FIXTURES

S = RunState
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


def calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def settings(tmp: Path, db: str | None = None) -> Settings:
    """The worker tests' settings: a SQLite file in `tmp`, or the database `db`."""
    return Settings(db=db or str(tmp / "w.db"), skills_dirs=(FIXTURES / "skills",),
                    policy_file=FIXTURES / "policy.yaml", llm_rules=FIXTURES / "llm_rules.yaml",
                    identities_file=FIXTURES / "identities.yaml", data_dir=tmp / "data")


def test_a_worker_drives_a_run_and_releases_its_lease(test_runtime: Runtime) -> None:
    """execute() takes the lease, drives the Run to its end and gives the lease back."""
    run, _ = test_runtime.runs.submit({"task": "echo hi", **TESS})
    result = RunWorker(test_runtime, owner="w1").execute(run.run_id)
    assert result is not None and result.state == "SUCCEEDED"
    after = test_runtime.store.get_run(run.run_id)
    assert after.lease_owner is None and after.lease_epoch == 1


def test_a_held_lease_keeps_other_workers_out(test_runtime: Runtime) -> None:
    """While one worker holds a Run's lease, another worker's execute() leaves the Run alone."""
    run, _ = test_runtime.runs.submit({"task": "echo hi", **TESS})
    first = RunWorker(test_runtime, owner="w1")
    assert first.leases.acquire(run.run_id, "w1") is not None
    assert RunWorker(test_runtime, owner="w2").execute(run.run_id) is None
    assert test_runtime.store.get_run(run.run_id).state == S.CREATED


def test_a_paused_worker_whose_run_was_taken_over_makes_no_further_side_effect(
        test_runtime: Runtime, clock: FakeClock, call_log: Path) -> None:
    """Worker A is stuck in a long call past its lease; B takes the Run over and finishes it; when A wakes
    up it makes no further tool call and no write, and every side effect happened exactly once."""
    run, _ = test_runtime.runs.submit({"task": "hang-idem 1.0", **TESS})
    a = RunWorker(test_runtime, owner="worker-a", ttl_s=60)
    thread = threading.Thread(target=a.execute, args=(run.run_id,))
    thread.start()
    deadline = time.monotonic() + 10
    while not any(c.get("phase") == "start" for c in calls(call_log)) and time.monotonic() < deadline:
        time.sleep(0.02)
    clock.advance(61)  # A's lease expires while it sleeps inside the call (think SIGSTOP or a long GC)
    b = RunWorker(test_runtime, owner="worker-b", ttl_s=60)
    result = b.execute(run.run_id)
    thread.join(timeout=30)
    assert result is not None and result.state == "SUCCEEDED", result
    log = calls(call_log)
    echoes = [c["step"] for c in log if c["skill"] == "test.echo"]
    assert echoes == ["a", "c"]  # A never ran step c, nobody ran a twice
    path = [t.to_state.value for t in test_runtime.store.transitions_of(run.run_id)]
    assert path.count("SUCCEEDED") == 1
    actors = {t.actor for t in test_runtime.store.transitions_of(run.run_id)}
    assert "worker-a" not in actors


def _drive_in_child(tmp: str, log: str, run_id: str, db: str | None = None) -> None:
    os.environ["HARNESS_TEST_CALL_LOG"] = log
    rt = build_runtime(settings(Path(tmp), db))
    RunWorker(rt, owner="doomed", ttl_s=1.0).execute(run_id)


def _kill_during_call(tmp: Path, log: Path, task: str, db: str | None = None) -> str:
    """Start a worker process on a fresh Run (on `db`, else a SQLite file in `tmp`), SIGKILL it inside
    step b, wait for its lease to lapse."""
    rt = build_runtime(settings(tmp, db))
    run, _ = rt.runs.submit({"task": task, **TESS})
    rt.close()
    proc = mp.get_context("spawn").Process(target=_drive_in_child, args=(str(tmp), str(log), run.run_id, db))
    proc.start()
    deadline = time.monotonic() + 180  # a spawned worker imports everything first: slow on a loaded machine
    while not any(c.get("phase") == "start" and c.get("step") == "b" for c in calls(log)) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(c.get("step") == "b" for c in calls(log)), "the worker never reached step b"
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    time.sleep(1.2)  # the dead worker's lease (1 s) lapses
    return run.run_id


def test_after_a_crash_a_non_idempotent_call_in_flight_is_not_repeated(tmp_path: Path, call_log: Path) -> None:
    """A worker killed inside a non-idempotent call: the next worker skips the completed step, does not
    run the in-flight one again, and fails the Run naming the step whose outcome is unknown (T6)."""
    run_id = _kill_during_call(tmp_path, call_log, "hang 30")
    rt = build_runtime(settings(tmp_path))
    try:
        result = RunWorker(rt, owner="rescuer").execute(run_id)
        assert result is not None and result.state == "CLOSED_FAILED"
        assert "outcome of b unknown" in (result.error or "")
        log = calls(call_log)
        assert [c["step"] for c in log if c["skill"] == "test.echo"] == ["a"]
        assert [c["phase"] for c in log if c["skill"] == "test.hang"] == ["start"]
        assert rt.store.get_run(run_id).stall_count == 1
    finally:
        rt.close()


def test_after_a_crash_an_idempotent_call_in_flight_is_run_again(tmp_path: Path, call_log: Path) -> None:
    """A worker killed inside an idempotent call: the next worker re-runs only that call and finishes."""
    run_id = _kill_during_call(tmp_path, call_log, "hang-idem 1.5")
    rt = build_runtime(settings(tmp_path))
    try:
        result = RunWorker(rt, owner="rescuer").execute(run_id)
        assert result is not None
        assert result.state == "SUCCEEDED", result.error
        log = calls(call_log)
        assert [c["step"] for c in log if c["skill"] == "test.echo"] == ["a", "c"]
        assert [c["phase"] for c in log if c["skill"] == "test.hang"] == ["start", "start", "end"]
    finally:
        rt.close()


def test_a_run_whose_workers_keep_dying_is_failed(test_runtime: Runtime, clock: FakeClock) -> None:
    """After max_stalls takeovers the Run is failed as poison instead of being retried forever (S1)."""
    run, _ = test_runtime.runs.submit({"task": "echo hi", **TESS})
    worker = RunWorker(test_runtime, owner="w", max_stalls=2)
    for n in range(2):
        assert worker.leases.acquire(run.run_id, f"dead-{n}") is not None
        clock.advance(61)
    result = worker.execute(run.run_id)
    assert result is not None and result.state == "CLOSED_FAILED"
    assert "worker_stalled" in (result.error or "")


def test_a_run_left_in_preparing_by_a_dead_worker_is_resumed(test_runtime: Runtime, clock: FakeClock) -> None:
    """A worker that died right after CREATED → PREPARING leaves a Run the next worker carries on (P1)."""
    run, _ = test_runtime.runs.submit({"task": "echo hi", **TESS})
    assert test_runtime.store.transition(run.run_id, S.CREATED, S.PREPARING, actor="dead", reason="x").applied
    result = RunWorker(test_runtime, owner="rescuer").execute(run.run_id)
    assert result is not None and result.state == "SUCCEEDED", result
