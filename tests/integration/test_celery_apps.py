"""Two Celery apps in one process each run their own harness tasks: no task of one app is registered on
the other, and no `DuplicateTaskNameWarning` is raised."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

from harness.adapters.sql.store import SqlStore
from harness.clock import SystemClock
from harness.domain.records import NewRun
from harness.kernel.states import RunState

S = RunState
TASKS = ("harness.drive", "harness.sweep", "harness.webhooks.deliver", "harness.checkpoint", "harness.archive")


def test_two_apps_register_their_own_tasks_without_a_duplicate_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Making a second app warns of no duplicate task name, and every task of each app, each one its beat
    schedule names among them, is that app's own callable, not the other app's."""
    celery = pytest.importorskip("celery")
    from harness import celery_app

    monkeypatch.setenv("HARNESS_CHECKPOINT_INTERVAL_S", "60")
    monkeypatch.setenv("HARNESS_ARCHIVE_INTERVAL_S", "120")
    with warnings.catch_warnings():
        warnings.simplefilter("error", celery.exceptions.DuplicateTaskNameWarning)
        first, second = celery_app.make_app("memory://"), celery_app.make_app("memory://")
        apps = [(app, dict(app.tasks)) for app in (first, second)]  # finalized here: registration happens now
    for app, tasks in apps:
        scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
        assert scheduled <= set(TASKS) and {"harness.sweep", "harness.checkpoint", "harness.archive"} <= scheduled
        assert all(tasks[name].app is app for name in TASKS)
    assert all(first.tasks[name].run is not second.tasks[name].run for name in TASKS)


def test_the_second_apps_sweep_resumes_runs_through_its_own_drive_task(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep task of a second app hands a stuck Run to that app's `harness.drive` (its broker), never to
    the first app's."""
    pytest.importorskip("celery")
    from harness import celery_app

    db = str(tmp_path / "apps.db")
    monkeypatch.setenv("HARNESS_DATABASE_URL", db)
    monkeypatch.setenv("HARNESS_STATE_THRESHOLDS", "PREPARING=0.05")
    monkeypatch.setenv("HARNESS_HEARTBEAT_CEILING_FACTOR", "1000")  # resumed, not yet forced
    monkeypatch.setenv("HARNESS_CHECKPOINT_INTERVAL_S", "0")
    first, second = celery_app.make_app("memory://"), celery_app.make_app("memory://")
    sent: dict[str, list[str]] = {"first": [], "second": []}
    monkeypatch.setattr(first.tasks["harness.drive"], "delay", sent["first"].append)
    monkeypatch.setattr(second.tasks["harness.drive"], "delay", sent["second"].append)
    store = SqlStore.open(db, SystemClock())
    try:
        run, _ = store.create_run(NewRun("t1", "u1", "s1", {"task": "x"}))
        assert store.transition(run.run_id, S.CREATED, S.PREPARING, actor="dead-worker", reason="step").applied
    finally:
        store.close()
    time.sleep(0.1)  # past the PREPARING threshold on the system clock the worker's runtime reads
    monkeypatch.setattr(celery_app, "_process", celery_app._Process())  # this test's runtime, dropped after
    try:
        assert second.tasks["harness.sweep"]()["resumed"] == 1
    finally:
        if celery_app._process.runtime is not None:
            celery_app._process.runtime.close()
    assert sent == {"first": [], "second": [run.run_id]}
