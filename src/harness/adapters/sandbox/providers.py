"""Which sandbox provider runs a call: local (this host's bubblewrap) or remote (a sandbox server), by
settings — for everything, or for some tenants or some skills only."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

from harness.domain.sandbox import Holder, SandboxJob, SandboxOutcome
from harness.ports import Sandbox


class ProviderChoice:
    """The sandbox port over two providers: `for_call` names the one a call of (skill, tenant) uses; the
    port's own methods use the local one. The local sandbox is made at its first use (probing bubblewrap
    costs a process start), the remote one is given."""

    provider = "local"

    def __init__(self, local: Callable[[], Sandbox], remote: Sandbox | None, *, default: str = "local",
                 remote_tenants: Collection[str] = (), remote_skills: Collection[str] = ()) -> None:
        if (default == "remote" or remote_tenants or remote_skills) and remote is None:
            raise ValueError("a remote sandbox provider is asked for but no server is set (HARNESS_SANDBOX_URL)")
        self._make_local = local
        self._local: Sandbox | None = None
        self._lock = threading.Lock()
        self.remote = remote
        self.default = default
        self.remote_tenants = frozenset(remote_tenants)
        self.remote_skills = frozenset(remote_skills)

    @property
    def local(self) -> Sandbox:
        """This host's sandbox."""
        with self._lock:
            if self._local is None:
                self._local = self._make_local()
            return self._local

    def for_call(self, skill_id: str, tenant_id: str) -> Sandbox:
        """The provider a call of the skill for the tenant runs on."""
        remote = self.default == "remote" or skill_id in self.remote_skills or tenant_id in self.remote_tenants
        return self.remote if remote and self.remote is not None else self.local

    @property
    def isolation(self) -> str:
        return self.local.isolation

    def run(self, job: SandboxJob) -> SandboxOutcome:
        return self.for_call(job.skill_id, job.context.get("tenant_id", "")).run(job)

    def start_instance(self, job: SandboxJob) -> Holder:
        return self.for_call(job.skill_id, job.context.get("tenant_id", "")).start_instance(job)

    def run_in(self, holder: Holder, job: SandboxJob) -> SandboxOutcome:
        return self.for_call(job.skill_id, job.context.get("tenant_id", "")).run_in(holder, job)
