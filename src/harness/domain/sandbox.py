"""What goes into a sandbox and what comes out, independent of how the isolation is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Resource limits of a sandboxed call (SPEC T4); wall time is the manifest's timeout_s."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    memory_mb: int = Field(default=512, ge=64, le=65_536)
    cpu_s: float = Field(default=10.0, gt=0, le=3_600)
    processes: int = Field(default=64, ge=1, le=4_096)
    file_mb: int = Field(default=64, ge=1, le=65_536)
    output_kb: int = Field(default=1_024, ge=1, le=1_048_576)


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


@dataclass(frozen=True)
class Holder:
    """An instance's process: its pid and the kernel's start time of that pid (so a pid reused by an
    unrelated process is not taken for the instance); (None, None) for the rlimit sandbox, which has no
    namespaces to hold."""

    pid: int | None = None
    pid_start: int | None = None
