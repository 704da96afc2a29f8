"""Sandboxes for skills that declare `sandbox: true` (SPEC T4): bubblewrap where the machine allows it,
otherwise a plain subprocess under rlimits that warns loudly that it is weaker."""

from __future__ import annotations

import logging
from typing import Literal

from harness.adapters.sandbox.bwrap import BwrapSandbox, unavailable_reason
from harness.adapters.sandbox.rlimit import RlimitSandbox
from harness.domain.errors import InvalidRequestError
from harness.ports import Sandbox

__all__ = ["select_sandbox"]

log = logging.getLogger("harness.sandbox")
SandboxMode = Literal["auto", "bwrap", "rlimit"]


def select_sandbox(mode: SandboxMode = "auto") -> Sandbox:
    """bubblewrap when asked for or available; the rlimit fallback otherwise (with a warning)."""
    if mode == "rlimit":
        return RlimitSandbox()
    reason = unavailable_reason()
    if reason is None:
        return BwrapSandbox()
    if mode == "bwrap":
        raise InvalidRequestError(f"sandbox 'bwrap' was asked for but cannot be used: {reason}")
    log.warning("bubblewrap unavailable (%s); falling back to the rlimit sandbox", reason)
    return RlimitSandbox()
