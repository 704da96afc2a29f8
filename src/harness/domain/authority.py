"""Who may act on a Run besides its requester: one rule for the HTTP API and the CLI."""

from __future__ import annotations

from harness.domain.contracts import CallerIdentity
from harness.domain.errors import ForbiddenError

#: the roles that may act on any Run of their tenant (cancel it, redeliver its callbacks, read the operations views)
OPERATOR_ROLES = frozenset({"operator", "auditor"})


def is_operator(who: CallerIdentity) -> bool:
    """True when `who` holds one of the operator roles."""
    return bool(OPERATOR_ROLES & set(who.roles))


def check_may_cancel(who: CallerIdentity, requester: str) -> None:
    """ForbiddenError unless `who` requested the Run (its user id is `requester`) or is an operator. The
    tenant is checked before this: a Run of another tenant is not found, not forbidden."""
    if who.user_id != requester and not is_operator(who):
        raise ForbiddenError("only the Run's requester or an operator may cancel it")
