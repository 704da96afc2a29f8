"""The store's contract tests (tests/unit/test_store_basics.py) on PostgreSQL and MariaDB (SPEC D2, K3,
K4, K5, K5b): the same test functions, re-collected here with the shared `store` fixture on a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_store_basics import (
    test_a_caller_cannot_choose_tracings_exit,
    test_a_run_closed_by_a_caller_through_the_machine_still_gets_its_run_trace,
    test_a_run_is_readable_through_a_new_engine_once_create_run_returns,
    test_a_run_survives_its_creator_being_killed_right_after_create_run,
    test_a_stale_lease_epoch_is_fenced_and_audited,
    test_an_illegal_attempt_on_an_unknown_run_is_still_audited,
    test_concurrent_submits_with_one_key_create_exactly_one_run,
    test_idempotency_keys_are_independent_across_tenants,
    test_repeated_submit_with_an_idempotency_key_returns_the_existing_run,
    test_retry_of_is_recorded_on_the_new_run_and_its_audit_event,
    test_unknown_run_id_is_named_as_such,
)

__all__ = [
    "test_a_caller_cannot_choose_tracings_exit",
    "test_a_run_closed_by_a_caller_through_the_machine_still_gets_its_run_trace",
    "test_a_run_is_readable_through_a_new_engine_once_create_run_returns",
    "test_a_run_survives_its_creator_being_killed_right_after_create_run",
    "test_a_stale_lease_epoch_is_fenced_and_audited",
    "test_an_illegal_attempt_on_an_unknown_run_is_still_audited",
    "test_concurrent_submits_with_one_key_create_exactly_one_run",
    "test_idempotency_keys_are_independent_across_tenants",
    "test_repeated_submit_with_an_idempotency_key_returns_the_existing_run",
    "test_retry_of_is_recorded_on_the_new_run_and_its_audit_event",
    "test_unknown_run_id_is_named_as_such",
]

BACKENDS = ("postgresql", "mariadb")


@pytest.fixture
def db_path(backend_url: str) -> Path:
    """The shared `store` fixture opens this: a fresh server database instead of a SQLite file."""
    return backend_url  # type: ignore[return-value]  # SqlStore.open takes str(db_path): a URL works
