"""The port of the memory table (SPEC C2, C5): what the memory store reads and writes, in rows.

A row is anything with the memory columns as attributes (entry_id, tenant_id, scope, team_id, user_id,
session_id, content, source_run_id; and embedding for `embedded`). Every read is confined to the
caller's scope by the adapter (in SQL), and the memory store checks each returned row again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class MemoryScope(Protocol):
    """Whose memory a read may see (harness.memory.scope.MemoryScope): the caller's own."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def user_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def team_id(self) -> str | None: ...


class MemoryRows(Protocol):
    """Scoped memory entries in a database."""

    def same_content(self, rows: Sequence[dict[str, Any]]) -> list[str | None]:
        """Per row to be stored: the id of the entry itself when it is already stored, else of an entry of
        the same scope with the same content hash that recall can see, else None."""
        ...

    def insert_new(self, rows: Sequence[dict[str, Any]]) -> None:
        """Store the rows whose entry id is not stored yet, in one transaction."""
        ...

    def lexical(self, scope: MemoryScope, query: str, k: int) -> list[tuple[Any, float]]:
        """The best `k` (row, score) pairs for `query` within `scope`; higher score is better."""
        ...

    def embedded(self, scope: MemoryScope, model: str) -> list[Any]:
        """The rows of `scope` embedded by `model`, with their embedding."""
        ...

    def backfill(self, batch: int, embed: Callable[[list[str]], list[bytes]], model: str) -> int:
        """Embed up to `batch` entries stored without an embedding, in one transaction; how many."""
        ...

    def entries_of_run(self, run_id: str) -> list[str]:
        """Ids of the entries a Run wrote back, oldest first."""
        ...

    def forget_user(self, tenant_id: str, user_id: str) -> int:
        """Delete every entry of a user (their user and session scopes); returns how many."""
        ...
