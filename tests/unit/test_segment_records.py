"""A tampered record in an archive segment is named as a failure, never a crash."""

from __future__ import annotations

from typing import Any

import pytest

from harness.audit import segment
from harness.domain.chain import GENESIS_HASH, record_hash


def _record(**change: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"seq": 1, "record_id": "r1", "run_id": "run-1", "kind": "transition",
                           "prev_hash": GENESIS_HASH, "payload": "{}"}
    rec["hash"] = record_hash(1, "r1", "run-1", "transition", GENESIS_HASH, "{}")
    return {**rec, **change}


def test_an_intact_record_gives_its_leaf() -> None:
    """The record the tests below tamper with is itself proven: index 0, its leaf hash."""
    found = segment._leaf(_record(), "line 2")
    assert isinstance(found, tuple) and found[0] == 0


@pytest.mark.parametrize("field", ["record_id", "run_id", "kind", "prev_hash", "payload"])
@pytest.mark.parametrize("value", [5, [1], {"a": 1}, True])
def test_a_record_field_that_is_not_a_string_is_a_failure(field: str, value: Any) -> None:
    """A record field of the wrong type is a failure naming the line, the record and the field."""
    assert segment._leaf(_record(**{field: value}), "line 2") == f"line 2: record seq 1: {field} must be a string"


@pytest.mark.parametrize("field", ["record_id", "kind", "prev_hash", "payload"])
def test_a_null_record_field_is_a_failure(field: str) -> None:
    """Only a record's run_id may be null (a record of no Run)."""
    assert segment._leaf(_record(**{field: None}), "line 2") == f"line 2: record seq 1: {field} must be a string"
