"""Memory scopes and the boundary rule (SPEC C2).

Every recall runs in the caller's scope: its tenant, user, session and (optional) team. An entry is
visible when it belongs to the caller's tenant and is tenant-wide, or belongs to the caller's team,
user, or user and session. A request that names any other tenant, user, session or team is refused
with ScopeViolationError — the Run fails — rather than answered with whatever happens to be visible.
The same rule is checked twice: in SQL before anything is scored (the adapter's scope clause), and
on every returned row (`MemoryScope.check`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from harness.context.errors import ScopeViolationError
from harness.domain.contracts import RunRequest

ScopeLevel = Literal["tenant", "team", "user", "session"]
LEVELS: tuple[ScopeLevel, ...] = ("tenant", "team", "user", "session")


@dataclass(frozen=True)
class MemoryScope:
    """Whose memory a recall may read: always the caller's own."""

    tenant_id: str
    user_id: str
    session_id: str
    team_id: str | None = None

    def admits(self, row: Any) -> bool:
        """Whether an entry (anything with the memory columns as attributes) is visible in this scope."""
        if row.tenant_id != self.tenant_id:
            return False
        if row.scope == "tenant":
            return True
        if row.scope == "team":
            return self.team_id is not None and row.team_id == self.team_id
        if row.scope == "user":
            return bool(row.user_id == self.user_id)
        if row.scope == "session":
            return bool(row.user_id == self.user_id and row.session_id == self.session_id)
        return False

    def check(self, rows: list[Any]) -> None:
        """Raise ScopeViolationError if any row lies outside this scope (a bug or a tampered row)."""
        for row in rows:
            if not self.admits(row):
                raise ScopeViolationError(
                    f"memory recall returned entry {row.entry_id} of tenant {row.tenant_id!r} "
                    f"({row.scope} scope) to caller {self.tenant_id}/{self.user_id}: refused")


def scope_of(request: RunRequest) -> MemoryScope:
    """The caller's scope; ScopeViolationError when the request asks for anyone else's memory."""
    own = MemoryScope(request.tenant_id, request.user_id, request.session_id, request.team_id)
    asked = request.memory
    if asked is None:
        return own
    for field, wanted, mine in (("tenant", asked.tenant_id, own.tenant_id),
                                ("user", asked.user_id, own.user_id),
                                ("session", asked.session_id, own.session_id),
                                ("team", asked.team_id, own.team_id)):
        if wanted is not None and wanted != mine:
            raise ScopeViolationError(
                f"memory recall for {field} {wanted!r} crosses the caller's {field} boundary "
                f"(caller {own.tenant_id}/{own.user_id}, {field} {mine!r}): refused")
    return own
