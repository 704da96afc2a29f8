"""Memory scopes and the boundary rule (SPEC C2).

Every recall runs in the caller's scope: its tenant, user, session and (optional) team. An entry is
visible when it belongs to the caller's tenant and is tenant-wide, or belongs to the caller's team,
user, or user and session. A request that names any other tenant, user, session or team is refused
with ScopeViolationError — the Run fails — rather than answered with whatever happens to be visible.
The same rule is checked twice: in SQL before anything is scored, and on every returned row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from harness.adapters.sql import schema as t
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

    def clause(self) -> sa.ColumnElement[bool]:
        """The same rule as SQL, plus: an entry written by a Run counts only once that Run SUCCEEDED (C5).
        Its values are bound parameters (`params()`): the clause is built once per shape, not per recall."""
        return _clause(self.team_id is not None)

    def params(self) -> dict[str, str]:
        """The values of `clause()`'s parameters."""
        values = {"p_scope_tenant": self.tenant_id, "p_scope_user": self.user_id, "p_scope_session": self.session_id}
        if self.team_id is not None:
            values["p_scope_team"] = self.team_id
        return values


@functools.cache
def _clause(with_team: bool) -> sa.ColumnElement[bool]:
    m = t.memory_entries
    user: sa.BindParameter[str] = sa.bindparam("p_scope_user")
    session: sa.BindParameter[str] = sa.bindparam("p_scope_session")
    visible = [m.c.scope == "tenant",
               sa.and_(m.c.scope == "user", m.c.user_id == user),
               sa.and_(m.c.scope == "session", m.c.user_id == user, m.c.session_id == session)]
    if with_team:
        visible.append(sa.and_(m.c.scope == "team", m.c.team_id == sa.bindparam("p_scope_team")))
    succeeded = sa.exists().where(t.runs.c.run_id == m.c.source_run_id, t.runs.c.state == "SUCCEEDED")
    return sa.and_(m.c.tenant_id == sa.bindparam("p_scope_tenant"), sa.or_(*visible),
                   sa.or_(m.c.source_run_id.is_(None), succeeded))


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
