"""The zombie sweeper's tests (test_sweeper.py) on PostgreSQL and MariaDB (SPEC S1, S3, K5b, D2): the
same test functions, re-collected here with the shared `store` fixture on a server database. The
index-plan test stays SQLite-only (it reads SQLite's query plan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_sweeper import (
    test_a_heartbeat_hides_a_run_only_until_its_ceiling,
    test_a_heartbeating_long_step_is_not_swept,
    test_a_resumable_stuck_run_is_handed_back_not_failed,
    test_a_tracing_run_whose_close_cannot_be_completed_is_failed,
    test_controller_timeout_and_sweeper_are_told_apart,
    test_each_stuck_state_is_forced_to_its_mapped_end,
    test_lease_takeover_fences_the_old_worker,
    test_runs_within_their_threshold_are_left_alone,
    test_several_sweepers_at_once_close_each_run_once,
)

__all__ = [
    "test_a_heartbeat_hides_a_run_only_until_its_ceiling",
    "test_a_heartbeating_long_step_is_not_swept",
    "test_a_resumable_stuck_run_is_handed_back_not_failed",
    "test_a_tracing_run_whose_close_cannot_be_completed_is_failed",
    "test_controller_timeout_and_sweeper_are_told_apart",
    "test_each_stuck_state_is_forced_to_its_mapped_end",
    "test_lease_takeover_fences_the_old_worker",
    "test_runs_within_their_threshold_are_left_alone",
    "test_several_sweepers_at_once_close_each_run_once",
]

BACKENDS = ("postgresql", "mariadb")


@pytest.fixture
def db_path(backend_url: str) -> Path:
    """The shared `store` fixture opens this: a fresh server database instead of a SQLite file."""
    return backend_url  # type: ignore[return-value]  # SqlStore.open takes str(db_path): a URL works
