"""What goes into a sandbox and what comes out, independent of how the isolation is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.skills import Limits


@dataclass(frozen=True)
class SandboxJob:
    """One call of a sandboxed skill: its entrypoint, arguments, working directory and limits."""

    skill_id: str
    function: str
    arguments: dict[str, Any]
    context: dict[str, str]
    workdir: Path
    wall_s: float
    limits: Limits = field(default_factory=Limits)
    network: bool = False
    entry_file: Path | None = None
    entry_module: str | None = None
    #: SHA-256 of the code the skill was pinned to (the file, or the module's source); the sandbox
    #: refuses to run code that no longer matches it (SPEC T1)
    entry_sha256: str | None = None
    #: extra environment variables of the call (the instance's leased ports)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        """The Run this call belongs to."""
        return self.context["run_id"]


@dataclass(frozen=True)
class SandboxOutcome:
    """How a sandboxed call ended. `error_code` names a contained escape or limit when there was one
    (e.g. sandbox_memory_limit, sandbox_network_denied, timeout); `isolation` says how strong the walls
    were ("bwrap" or the weaker "rlimit")."""

    ok: bool
    isolation: str
    output: Any = None
    error_code: str | None = None
    message: str = ""
    retryable: bool = False
    exit_status: int | None = None
    stderr_tail: str = ""
    duration_ms: float = 0.0
