"""The stored contents the trace references by hash (the blob store), as its readers need them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class StoredContents(Protocol):
    """Contents filed under their hash (the SHA-256 of their canonical JSON)."""

    def raw(self, hashes: Iterable[str]) -> dict[str, str]:
        """The stored text of each hash that has content, unchecked (absent hashes are left out)."""
        ...
