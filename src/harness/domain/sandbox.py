"""What goes into a sandbox and what comes out, independent of how the isolation is made; and the sandbox
instances a Run keeps, with the scarce units (caps, ports) they hold (seed 004 §3.4-3.5)."""

from __future__ import annotations

from collections.abc import Sequence
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
    #: sys.path entries the call needs first (a code skill's module root and the harness package's)
    python_path: tuple[Path, ...] = ()
    #: code the call must see besides the Python installation, read-only (a code skill's package, harness)
    code_paths: tuple[Path, ...] = ()
    #: the most bytes of the call's stdout, and of its stderr, its outcome keeps (the start and the end)
    stream_bytes: int = 16_384

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
    #: what the skill printed on its stdout and its stderr, each within the job's `stream_bytes` (a longer
    #: stream keeps its start and its end, with a line saying how much was left out between them)
    stdout: str = ""
    stderr: str = ""


@dataclass(frozen=True)
class Holder:
    """An instance's process: its pid and the kernel's start time of that pid (so a pid reused by an
    unrelated process is not taken for the instance); (None, None) for the rlimit sandbox, which has no
    namespaces to hold."""

    pid: int | None = None
    pid_start: int | None = None


#: the states of a sandbox instance: live, released (its Run closed) or dead (its process went away, or its
#: host stopped renewing it)
LIVE, RELEASED, DEAD = "live", "released", "dead"


@dataclass(frozen=True)
class PoolSettings:
    """This host's name, its caps and port range, and how long an instance's lease lives unrenewed."""

    host: str
    host_cap: int = 32
    tenant_cap: int = 16
    port_range: tuple[int, int] | None = (41000, 41255)
    lease_s: float = 300.0


@dataclass(frozen=True)
class InstanceRow:
    """One sandbox instance as the database has it: the host it lives on, its process (pid and start time),
    its leased ports, how often it was (re)created, and its state."""

    instance_id: str
    run_id: str
    skill_id: str
    tenant_id: str
    user_id: str
    host: str
    state: str
    isolation: str
    pid: int | None
    pid_start: int | None
    owner: str
    ports: tuple[int, ...]
    generation: int
    calls: int
    persistent: bool
    held_s: float
    billed: bool
    created_at: float
    started_at: float
    used_at: float
    lease_expires_at: float
    ended_at: float | None
    end_reason: str | None
    #: which sandbox provider holds its process: "local" (this row's host) or "remote" (a sandbox server)
    provider: str = "local"

    def held_until(self, now: float) -> float:
        """Seconds this instance has existed, over all its generations, up to `now`."""
        return self.held_s + (max(0.0, now - self.started_at) if self.state == LIVE else 0.0)


@dataclass(frozen=True)
class Claim:
    """What a call asks for: an instance of (run, skill) on a host, holding `ports` ports."""

    run_id: str
    skill_id: str
    tenant_id: str
    user_id: str
    host: str
    isolation: str
    persistent: bool
    ports: int
    owner: str
    provider: str = "local"


@dataclass(frozen=True)
class Capacity:
    """The limits units are taken within: the host's and the tenant's caps, the host's port range."""

    host_cap: int
    tenant_cap: int
    port_range: tuple[int, int] | None = None

    def needs(self, claim: Claim) -> list[tuple[str, str, Sequence[int], int]]:
        """(resource, its name for people, its units, how many the claim takes)."""
        wanted: list[tuple[str, str, Sequence[int], int]] = [
            (f"tenant:{claim.tenant_id}", f"tenant {claim.tenant_id}'s instance cap ({self.tenant_cap})",
             range(self.tenant_cap), 1),
            (f"host:{claim.host}", f"the host's instance cap ({self.host_cap})", range(self.host_cap), 1)]
        if claim.ports:
            low, high = self.port_range or (0, -1)
            size = high - low + 1
            wanted.append((f"port:{claim.host}", f"the host's port pool ({size} ports, {low}-{high})",
                           range(low, high + 1), claim.ports))
        return wanted


class ShortageError(Exception):
    """No unit of a resource is free: `resource` names it for people."""

    def __init__(self, resource: str) -> None:
        super().__init__(resource)
        self.resource = resource


@dataclass(frozen=True)
class PoolUse:
    """What is held right now: live instances by host and tenant, leased ports by host."""

    live_by_host: dict[str, int]
    live_by_tenant: dict[str, int]
    ports_by_host: dict[str, int]
