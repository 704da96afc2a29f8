"""Why a context could not be assembled (SPEC C1-C4). Each is a ContextError, so the Run manager
fails the Run in PREPARING with the error's code in its ErrorTrace.

    ContextError                       (harness.domain.errors) budget: the fixed part alone does not fit
    ├── ScopeViolationError            a recall would cross a tenant/user/session/team boundary (C2)
    ├── CompressionRefusedError        compression would lose a key item (C3)
    └── SecretFilterError              the secret filter failed, so nothing may be sent (C4)

A recall that merely fails (database down, model missing) is not here: it degrades to no memory.
"""

from __future__ import annotations

from harness.domain.errors import ContextError


class ScopeViolationError(ContextError):
    """A memory recall would cross a scope boundary: a hard failure, never a filtered-down result."""

    code = "memory_scope_violation"


class CompressionRefusedError(ContextError):
    """The history cannot be made to fit without dropping a key item, so the Run is refused."""

    code = "compression_refused"


class SecretFilterError(ContextError):
    """The secret filter raised or could not verify its own output: the context is not safe to send."""

    code = "secret_filter_failed"


class RecallError(Exception):
    """A recall failed for a reason other than scope; the assembler degrades to no memory."""
