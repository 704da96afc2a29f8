"""Who may read which knowledge-base chunks: the memory rule applied to documents.

A search runs in the caller's scope: its tenant, the knowledge bases its agent may read, and its team. A
chunk is visible when it belongs to the caller's tenant, to one of those knowledge bases, and to every agent
(or this agent) and every team (or the caller's team). The rule is checked twice: in SQL before anything is
scored (the adapter's scope clause), and on every returned row (`KnowledgeScope.check`); a row outside the
scope is a hard failure (the Run fails), never filtered out quietly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.context.errors import ScopeViolationError


class KnowledgeScopeError(ScopeViolationError):
    """A knowledge-base search would cross the caller's tenant, agent or team boundary: the Run fails."""

    code = "knowledge_scope_violation"


@dataclass(frozen=True)
class KnowledgeScope:
    """Whose chunks a search may read: the caller's tenant's, in the knowledge bases its agent reads."""

    tenant_id: str
    bases: tuple[str, ...]
    agent: str | None = None
    team_id: str | None = None

    def admits(self, row: Any) -> bool:
        """Whether a chunk (anything with the chunk columns as attributes) is visible in this scope."""
        return bool(row.tenant_id == self.tenant_id and row.kb in self.bases
                    and (row.agent is None or row.agent == self.agent)
                    and (row.team_id is None or row.team_id == self.team_id))

    def check(self, rows: list[Any]) -> None:
        """Raise KnowledgeScopeError if any row lies outside this scope (a query bug or a tampered row)."""
        for row in rows:
            if not self.admits(row):
                raise KnowledgeScopeError(
                    f"knowledge search returned chunk {row.chunk_id} of tenant {row.tenant_id!r} (knowledge base "
                    f"{row.kb!r}) to a caller of tenant {self.tenant_id!r} reading {list(self.bases)}: refused")
