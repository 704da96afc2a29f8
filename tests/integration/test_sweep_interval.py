"""How often the sweeper passes is one setting, `sweep_interval_s` (HARNESS_SWEEP_INTERVAL_S, 30 s by
default), and every way of running the sweeper follows it: the Celery beat entry that schedules the
`harness.sweep` task, `harness sweep --forever`, the housekeeping loop of `harness serve`, and a Celery
worker's pruning of its host's working directories."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock, SystemClock
from harness.config import Runtime, build_runtime
from harness.domain.records import NewRun
from harness.kernel.states import RunState
from harness.service.worker import EmbeddedWorker
from harness.settings import Settings

S = RunState


def failed_and_left(store: SqlStore) -> str:
    """A Run its driver moved to FAILED and then died: only the funnel to TRACING is missing."""
    run, _ = store.create_run(NewRun("t1", "u1", "s1", {"task": "x"}))
    assert store.transition(run.run_id, S.CREATED, S.PREPARING, actor="dead-worker", reason="step").applied
    assert store.transition(run.run_id, S.PREPARING, S.FAILED, actor="dead-worker", reason="boom").applied
    return run.run_id


def state_of(db: str, run_id: str) -> RunState:
    store = SqlStore.open(db, SystemClock())
    try:
        return store.get_run(run_id).state
    finally:
        store.close()


def test_the_sweep_interval_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """HARNESS_SWEEP_INTERVAL_S sets the interval; without it the interval is 30 s; a value that is not a
    positive number of seconds is refused by name."""
    monkeypatch.delenv("HARNESS_SWEEP_INTERVAL_S", raising=False)
    monkeypatch.delenv("HARNESS_CONFIG_FILE", raising=False)
    assert Settings.from_env().sweep_interval_s == 30.0
    monkeypatch.setenv("HARNESS_SWEEP_INTERVAL_S", "7.5")
    assert Settings.from_env().sweep_interval_s == 7.5
    monkeypatch.setenv("HARNESS_SWEEP_INTERVAL_S", "0")
    with pytest.raises(Exception, match="sweep_interval_s"):
        Settings.from_env()


def test_the_celery_beat_runs_the_sweep_task_every_sweep_interval(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Beat's `harness-sweep` entry schedules `harness.sweep` every sweep interval (30 s by default, the
    setting when given), and that task, run as beat would have it run, sweeps the database."""
    pytest.importorskip("celery")
    from harness import celery_app

    monkeypatch.delenv("HARNESS_SWEEP_INTERVAL_S", raising=False)
    monkeypatch.delenv("HARNESS_CONFIG_FILE", raising=False)
    assert celery_app.make_app("memory://").conf.beat_schedule["harness-sweep"] == {
        "task": "harness.sweep", "schedule": 30.0}
    monkeypatch.setenv("HARNESS_SWEEP_INTERVAL_S", "7")
    db = str(tmp_path / "beat.db")
    monkeypatch.setenv("HARNESS_DATABASE_URL", db)
    monkeypatch.setenv("HARNESS_STATE_THRESHOLDS", "FAILED=0.2")
    monkeypatch.setenv("HARNESS_CHECKPOINT_INTERVAL_S", "0")
    app = celery_app.make_app("memory://")
    entry = app.conf.beat_schedule["harness-sweep"]
    assert entry == {"task": "harness.sweep", "schedule": 7.0}
    store = SqlStore.open(db, SystemClock())
    try:
        run_id = failed_and_left(store)
    finally:
        store.close()
    time.sleep(0.3)
    monkeypatch.setattr(celery_app, "_process", celery_app._Process())  # this test's runtime, dropped after
    try:
        assert app.tasks[entry["task"]]()["recovered"] == 1
    finally:
        if celery_app._process.runtime is not None:
            celery_app._process.runtime.close()
    assert state_of(db, run_id) == S.CLOSED_FAILED


def test_harness_sweep_forever_passes_every_sweep_interval(tmp_path: Path) -> None:
    """`harness sweep --forever` with HARNESS_SWEEP_INTERVAL_S=0.5 says so and closes a Run stuck past
    its (1 s) threshold within seconds of starting: on the 30 s default it would not have passed yet."""
    db = str(tmp_path / "sweep.db")
    store = SqlStore.open(db, SystemClock())
    try:
        run_id = failed_and_left(store)
    finally:
        store.close()
    env = {**os.environ, "HARNESS_SWEEP_INTERVAL_S": "0.5", "HARNESS_STATE_THRESHOLDS": "FAILED=1",
           "HARNESS_CHECKPOINT_INTERVAL_S": "0"}
    err = tmp_path / "sweep.err"
    with err.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "sweep", "--forever", "--db", db], env=env,
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while "sweeping every" not in err.read_text():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "the sweeper did not start"
            time.sleep(0.1)
        assert "sweeping every 0.5s" in err.read_text()
        started = time.monotonic()
        while state_of(db, run_id) != S.CLOSED_FAILED:
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() - started < 10, "no sweep passed within 10 s"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_the_service_housekeeping_sweeps_once_per_sweep_interval(tmp_path: Path, clock: FakeClock) -> None:
    """`harness serve`'s housekeeping passes often (approval timeouts, the outbox) but sweeps only once
    per sweep interval: a Run stuck past its threshold is left by a pass before the interval is up and
    closed by the first pass after it."""
    rt = build_runtime(Settings(db=str(tmp_path / "serve.db"), data_dir=tmp_path / "data", memory="off",
                                sweep_interval_s=1.0, checkpoint_interval_s=0), clock=clock)
    worker = EmbeddedWorker(rt, housekeeping_interval_s=3600)
    try:
        run_id = failed_and_left(rt.store)
        clock.advance(31)  # past the FAILED threshold of 30 s
        worker.housekeep()
        assert rt.store.get_run(run_id).state == S.FAILED
        time.sleep(1.1)
        worker.housekeep()
        assert rt.store.get_run(run_id).state == S.CLOSED_FAILED
    finally:
        worker.stop()
        rt.close()


def test_a_worker_prunes_working_directories_every_configured_sweep_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker process prunes its host's working directories of final Runs once per the settings' sweep
    interval (5 s here), not once per the default 30 s."""
    pytest.importorskip("celery")
    from harness import celery_app

    pruned: list[float] = []
    now = [1000.0]
    rt = SimpleNamespace(settings=SimpleNamespace(sweep_interval_s=5.0),
                         runs=SimpleNamespace(prune_workdirs=lambda: pruned.append(now[0])))
    monkeypatch.setattr(celery_app, "_last_prune", [0.0])
    monkeypatch.setattr(time, "monotonic", lambda: now[0])  # the module harness.celery_app reads
    for t in (1000.0, 1004.0, 1006.0, 1010.0, 1011.5):
        now[0] = t
        celery_app._prune_now_and_then(cast(Runtime, rt))
    assert pruned == [1000.0, 1006.0, 1011.5]
