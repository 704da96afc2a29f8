"""A tenant-wide change stream never reads past a hole in the change feed until it is filled or stale."""

from __future__ import annotations

from harness.service.sse import CommitHorizon


class Clock:
    """Seconds that move only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_ids_are_read_to_the_end() -> None:
    """No hole: everything committed after the position may be read."""
    assert CommitHorizon(2.0, Clock()).through(10, [11, 12, 13]) == 13
    assert CommitHorizon(2.0, Clock()).through(10, []) == 10


def test_a_hole_holds_the_stream_until_it_is_filled() -> None:
    """Change 11's transaction has not committed but 12's has: the stream stops at 10, then reads on
    once 11 is there."""
    clock = Clock()
    horizon = CommitHorizon(2.0, clock)
    assert horizon.through(10, [12, 13]) == 10
    clock.now = 1.5
    assert horizon.through(10, [12, 13]) == 10
    assert horizon.through(10, [11, 12, 13]) == 13


def test_a_hole_that_stays_is_a_rollback_and_is_passed_after_the_grace() -> None:
    """An id drawn by a transaction that rolled back never appears: past the grace the stream goes on,
    and a later hole gets its own wait."""
    clock = Clock()
    horizon = CommitHorizon(2.0, clock)
    assert horizon.through(10, [12, 13, 15]) == 10
    clock.now = 2.0
    assert horizon.through(10, [12, 13, 15]) == 13  # 11 given up; 14 is a new hole, its wait starts now
    clock.now = 3.0
    assert horizon.through(13, [15]) == 13
    clock.now = 4.0
    assert horizon.through(13, [15]) == 15
