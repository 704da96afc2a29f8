"""The scheduled archive pass: `harness serve`'s housekeeping starts one when due, and the Celery beat
schedules `harness.archive`; both do nothing until a retention period is set."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.drive.state_machine import StateMachine
from harness.retention.policy import DAY_S
from harness.retention.scheduled import ScheduledArchiver
from harness.wiring.retention import archiver_factory
from tests.integration.bulk_runs import clone, drive


def test_the_scheduled_pass_archives_only_with_a_retention_period(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Without HARNESS_RETENTION_DAYS a due pass archives nothing; with it, the next due pass archives the
    old Runs into HARNESS_ARCHIVE_URL; interval 0 never starts one."""
    clock = FakeClock()
    store = SqlStore.open(str(tmp_path / "h.db"), clock)
    clone(store, drive(StateMachine(store)), 4)
    clock.advance(3 * DAY_S)
    monkeypatch.setenv("HARNESS_ARCHIVE_URL", str(tmp_path / "archive"))
    monkeypatch.delenv("HARNESS_RETENTION_DAYS", raising=False)
    never = ScheduledArchiver(archiver_factory(store, tmp_path / "cp", []), interval_s=0)
    never.start_if_due()
    assert never.pending is None
    scheduled = ScheduledArchiver(archiver_factory(store, tmp_path / "cp", []), interval_s=1e-6)
    time.sleep(0.01)  # the interval has passed (a fast machine gets from the constructor here in under 1 us)
    scheduled.start_if_due()
    assert scheduled.pending is not None and scheduled.pending.result(timeout=30) is None
    monkeypatch.setenv("HARNESS_RETENTION_DAYS", "1")
    scheduled._next = 0.0  # the interval has passed (real time, as the checkpoint publisher's)
    scheduled.start_if_due()
    report = scheduled.pending.result(timeout=60)
    scheduled.close()
    assert report is not None and report.runs == report.pruned_runs == 5
    assert len(list((tmp_path / "archive").iterdir())) == 1


def test_the_celery_beat_schedules_the_archive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beat runs `harness.archive` every HARNESS_ARCHIVE_INTERVAL_S; 0 leaves it out."""
    pytest.importorskip("celery")
    from harness.celery_app import make_app

    monkeypatch.setenv("HARNESS_ARCHIVE_INTERVAL_S", "120")
    app = make_app("memory://")
    assert app.conf.beat_schedule["harness-archive"] == {"task": "harness.archive", "schedule": 120.0}
    assert "harness.archive" in app.tasks
    monkeypatch.setenv("HARNESS_ARCHIVE_INTERVAL_S", "0")
    assert "harness-archive" not in make_app("memory://").conf.beat_schedule
