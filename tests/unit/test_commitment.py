"""A RunTrace's record commitment names exactly the records it was given, and a malformed one is refused."""

from __future__ import annotations

import pytest

from harness.audit import commitment
from harness.domain.ids import ordered_id


def test_the_commitment_round_trips_ids_and_kinds() -> None:
    """Every (id, kind) given comes back, ordered ids packed as bytes, any other id kept as it is; a
    repeated id counts once."""
    records = [(ordered_id(), kind) for kind in ("transition", "audit", "tool", "audit")] + [("legacy-id", "step")]
    doc = commitment.encode([*records, records[0]])
    assert doc["count"] == 5 and doc["other"] == {"step": ["legacy-id"]}
    assert commitment.decode(doc) == dict(records)


@pytest.mark.parametrize(("doc", "says"), [
    (None, "ids by kind"),
    ({"count": 1, "ids": {"audit": "not base64!"}}, "base64"),
    ({"count": 1, "ids": {"audit": "AAAA"}}, "16-byte"),
    ({"count": 2, "ids": {"audit": "A" * 22 + "=="}}, "count is 2"),
])
def test_a_malformed_commitment_is_refused(doc: object, says: str) -> None:
    """A commitment that is not the shape written, or whose count disagrees with its ids, is an error."""
    with pytest.raises(commitment.CommitmentError, match=says):
        commitment.decode(doc)
