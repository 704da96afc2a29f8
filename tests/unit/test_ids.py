"""Time-ordered ids (harness.domain.ids): valid version-7 UUIDs that sort by creation time."""

from __future__ import annotations

import time
import uuid

import pytest

from harness.domain.ids import ordered_id


def test_an_ordered_id_is_a_canonical_version_7_uuid() -> None:
    for _ in range(2000):
        value = ordered_id()
        parsed = uuid.UUID(value)
        assert str(parsed) == value  # canonical form: lower-case hex, 8-4-4-4-12
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122


def test_ids_sort_by_the_millisecond_they_were_made_in(monkeypatch: pytest.MonkeyPatch) -> None:
    made = []
    for millis in (1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_123, 1_800_000_000_000):
        monkeypatch.setattr(time, "time_ns", lambda m=millis: m * 1_000_000)  # the module harness.domain.ids reads
        made.append(ordered_id())
        assert uuid.UUID(made[-1]).int >> 80 == millis  # the first 48 bits are the Unix milliseconds
    assert made == sorted(made)


def test_ids_made_in_the_same_millisecond_are_still_distinct(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_000 * 1_000_000)
    assert len({ordered_id() for _ in range(10_000)}) == 10_000


def test_ids_made_later_sort_later() -> None:
    first = ordered_id()
    time.sleep(0.002)
    assert ordered_id() > first
