"""The kernel's race tests (test_races.py) on PostgreSQL and MariaDB (SPEC D2, K4, K6, K8, A3).

The same test functions, re-collected here with server backends; fewer Runs per scenario keep the file
fast, and every Run is still raced by every decision.
"""

from __future__ import annotations

import pytest

from tests.integration import test_races as base
from tests.integration.test_races import (
    test_approve_races_cancel,
    test_cancel_races_hitl_timeout,
    test_success_races_cancel_and_execution_timeout,
)

__all__ = ["test_approve_races_cancel", "test_cancel_races_hitl_timeout",
           "test_success_races_cancel_and_execution_timeout"]

pytestmark = pytest.mark.slow
BACKENDS = ("postgresql", "mariadb")


@pytest.fixture(autouse=True)
def _fewer_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "RUNS_PER_SCENARIO", 40)
