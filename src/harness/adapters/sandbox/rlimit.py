"""The weaker fallback sandbox: a plain subprocess under rlimits, for machines without bubblewrap.

It bounds memory, CPU, file size and wall time and gives the call its own working directory as cwd,
but it does NOT cut the network, does NOT hide the filesystem, and — when the harness runs as root —
cannot cap the number of processes (root is exempt from RLIMIT_NPROC). It says so in the log when
it is chosen, and every call it runs is traced with isolation "rlimit".
"""

from __future__ import annotations

import logging
import os

from harness.adapters.sandbox.process import run_process, runner_argv
from harness.domain.sandbox import Holder, SandboxJob, SandboxOutcome

log = logging.getLogger("harness.sandbox")

WEAKER = ("sandbox fallback in use: skills run as plain subprocesses under rlimits only — no network "
          "isolation, no filesystem isolation{root}. Install bubblewrap (apt-get install bubblewrap) for "
          "real isolation.")


class RlimitSandbox:
    """Runs a sandboxed skill as a subprocess with rlimits and a wall-time kill of its process group."""

    isolation = "rlimit"

    def __init__(self, *, warn: bool = True) -> None:
        if warn:
            root = ", no process-count limit (running as root)" if os.geteuid() == 0 else ""
            log.warning(WEAKER.format(root=root))

    def run(self, job: SandboxJob) -> SandboxOutcome:
        """Run one call; its failure is described in the outcome, never raised."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(job.workdir), "LANG": "C.UTF-8",
               "TMPDIR": str(job.workdir), **job.env}
        return run_process(runner_argv(), job, isolation=self.isolation, env=env)

    def start_instance(self, job: SandboxJob) -> Holder:
        """A kept instance here has no namespaces to hold: its processes are the skill's own."""
        return Holder()

    def run_in(self, holder: Holder, job: SandboxJob) -> SandboxOutcome:
        """Run one call of a kept instance (the same plain subprocess, with the instance's variables)."""
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(job.workdir), "LANG": "C.UTF-8",
                "TMPDIR": str(job.workdir)}
        return run_process(runner_argv(), job, isolation=self.isolation, env={**base, **job.env}, linger=False)
