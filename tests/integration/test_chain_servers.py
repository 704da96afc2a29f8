"""The kernel's chain-concurrency tests (test_chain_concurrency.py) on PostgreSQL and MariaDB (SPEC D2,
A3, A4): the same test functions, re-collected here with server backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_chain_concurrency import (
    test_a_redelivered_record_in_a_mixed_batch_is_dropped_and_the_rest_chained_once,
    test_a_redelivered_record_is_dropped_and_the_chain_is_unchanged,
    test_processes_writing_and_draining_never_fork_the_chain,
    test_threads_writing_and_draining_never_fork_the_chain,
)

__all__ = ["test_a_redelivered_record_in_a_mixed_batch_is_dropped_and_the_rest_chained_once",
           "test_a_redelivered_record_is_dropped_and_the_chain_is_unchanged",
           "test_processes_writing_and_draining_never_fork_the_chain",
           "test_threads_writing_and_draining_never_fork_the_chain"]

pytestmark = pytest.mark.slow
BACKENDS = ("postgresql", "mariadb")


@pytest.fixture
def db_path(backend_url: str) -> Path:
    """The shared `store` fixture opens this: a fresh server database instead of a SQLite file."""
    return backend_url  # type: ignore[return-value]  # SqlStore.open takes str(db_path): a URL works
