"""The kernel's crash tests (test_crash.py) on PostgreSQL and MariaDB (SPEC D2, K4, K5, A3, A4).

The same test functions, re-collected here with server backends.
"""

from __future__ import annotations

import pytest

from tests.integration.test_crash import (
    test_a_drainer_killed_mid_drain_neither_loses_nor_repeats_a_record,
    test_killed_writers_leave_every_run_consistent,
)

__all__ = ["test_a_drainer_killed_mid_drain_neither_loses_nor_repeats_a_record",
           "test_killed_writers_leave_every_run_consistent"]

pytestmark = pytest.mark.slow
BACKENDS = ("postgresql", "mariadb")
