"""Shared fixtures: a real SQLite store in a temporary folder, and a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.state_machine import StateMachine


@pytest.fixture
def clock() -> FakeClock:
    """A clock that only moves when the test says so."""
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Path of a fresh SQLite database file (created on first open)."""
    return tmp_path / "harness.db"


@pytest.fixture
def store(db_path: Path, clock: FakeClock) -> Iterator[SqlStore]:
    """A migrated SQLite store on the fake clock."""
    s = SqlStore.open(str(db_path), clock)
    yield s
    s.close()


@pytest.fixture
def machine(store: SqlStore) -> StateMachine:
    """The state machine over the test store."""
    return StateMachine(store)
