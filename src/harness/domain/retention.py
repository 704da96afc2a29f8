"""What the database keeps of an archived, pruned Run: where its segment is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ArchivedRun:
    """An archived, pruned Run and the segment that holds it."""

    run_id: str
    segment_id: str
    tenant_id: str
    state: str
    created_at: float
    closed_at: float
    archived_at: float
    location: str
    checkpoint: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document."""
        return {f: getattr(self, f) for f in self.__slots__}
