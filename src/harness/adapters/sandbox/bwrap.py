"""The bubblewrap sandbox: a skill call in its own namespaces, seeing only what Python needs.

Inside, the call sees read-only binds of /usr (and the /bin, /lib… links), a few harmless /etc files,
the Python installation and the packages the interpreter imports, and the skill's own folder; a
private size-bounded /tmp; and, writable, only its Run's working directory. Network, PID, IPC and
UTS namespaces are unshared (the network only unless the manifest declares `network: true`).

Run as root, bwrap keeps CAP_SETUID/CAP_SETGID for the runner, which switches to a user of its own
derived from the run id before any skill code runs: RLIMIT_NPROC then applies (root is exempt) and
Runs cannot touch each other's files. Run unprivileged, bwrap uses a user namespace instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from harness.adapters.sandbox.instance import process_start, read_info, wait_ready
from harness.adapters.sandbox.process import RUNNER, run_process, runner_argv
from harness.domain.sandbox import Holder, SandboxJob, SandboxOutcome

UID_BASE = 200_000
UID_SPAN = 100_000
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives", "passwd", "group",
        "nsswitch.conf", "hosts", "mime.types")
_ETC_NETWORK = ("resolv.conf", "ssl", "ca-certificates", "gai.conf")


def identity_for(run_id: str) -> tuple[int, int]:
    """The unprivileged uid/gid a Run's sandboxed calls run as (stable for the Run)."""
    uid = UID_BASE + int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16) % UID_SPAN
    return uid, uid


@functools.cache
def interpreter_paths() -> tuple[Path, ...]:
    """What the sandboxed interpreter reads: its prefixes and its sys.path (with .pth additions)."""
    probe = subprocess.run([*runner_argv()[:2], "-c", "import json, sys; print(json.dumps(sys.path))"],
                           capture_output=True, text=True, timeout=30, check=True)
    entries = [Path(p) for p in json.loads(probe.stdout) if p]
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    found = [Path(r) for r in roots] + entries + [Path(sys.executable).parent]
    return tuple(sorted({p.resolve() for p in found if p.exists()}))


@functools.cache
def unavailable_reason(binary: str = "bwrap") -> str | None:
    """Why bubblewrap cannot be used here, or None when a trial sandbox started and exited cleanly."""
    path = shutil.which(binary)
    if path is None:
        return f"{binary} is not installed"
    trial = [path, *_namespaces(network=False, privileged=os.geteuid() == 0), *_system_mounts(),
             "--", "/usr/bin/env", "true"]
    try:
        done = subprocess.run(trial, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} could not start: {exc}"
    if done.returncode != 0:
        return f"{binary} cannot create namespaces here: {done.stderr.strip()[:300]}"
    return None


def _namespaces(*, network: bool, privileged: bool, kept: bool = False) -> list[str]:
    args = [] if kept else ["--die-with-parent"]  # a kept instance outlives the process that started it
    args += ["--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try"]
    if not network:
        args.append("--unshare-net")
    if privileged:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return args


def _system_mounts() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev"]
    for link in _SYSTEM_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    return args


def hand_over(workdir: Path, uid: int, gid: int) -> None:
    """Give the Run's user everything in its directory, including what a local skill of the same Run
    or the operator put there since the last sandboxed call (symlinks themselves, never their targets)."""
    for folder, dirs, files in os.walk(workdir):  # does not follow symlinked folders
        for name in [".", *dirs, *files]:
            path = os.path.join(folder, name)
            if os.lstat(path).st_uid != uid:
                os.lchown(path, uid, gid)


class MountPlan:
    """bwrap arguments for binds at their host paths, creating each missing parent folder 0755
    (bwrap would create it 0700, which an unprivileged sandbox user could not enter)."""

    def __init__(self, existing: Iterable[str]) -> None:
        self.args: list[str] = []
        self._bound: list[Path] = []
        self._dirs = {Path(p) for p in existing}

    def covered(self, path: Path) -> bool:
        """Whether the path is already visible through an earlier bind."""
        return any(path == b or b in path.parents for b in self._bound)

    def bind(self, path: Path, *, writable: bool = False) -> None:
        """Bind a host path at the same place inside."""
        if not writable and self.covered(path):
            return
        for parent in reversed(path.parents):
            if parent not in self._dirs and not self.covered(parent):
                self.args += ["--perms", "0755", "--dir", str(parent)]
                self._dirs.add(parent)
        self.args += ["--bind" if writable else "--ro-bind", str(path), str(path)]
        self._bound.append(path)


class BwrapSandbox:
    """Runs sandboxed skills under bubblewrap (SPEC T4)."""

    isolation = "bwrap"

    def __init__(self, binary: str = "bwrap") -> None:
        path = shutil.which(binary)
        if path is None:
            raise RuntimeError(f"{binary} is not installed")
        self.binary = path
        self.privileged = os.geteuid() == 0
        self.nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
        self.setsid = shutil.which("setsid") or "/usr/bin/setsid"

    def run(self, job: SandboxJob) -> SandboxOutcome:
        """Run one call; its failure is described in the outcome, never raised."""
        uid, gid = identity_for(job.run_id) if self.privileged else (None, None)
        if uid is not None and gid is not None:
            hand_over(job.workdir, uid, gid)
        env = {"PATH": "/usr/bin:/bin"}
        return run_process(self.argv(job), job, isolation=self.isolation, env=env, uid=uid, gid=gid,
                           bwrap_status=True, network_cut=not job.network)

    def start_instance(self, job: SandboxJob) -> Holder:
        """Start a kept instance for the job's Run and skill: a holder process in the namespaces every
        later call enters (see harness.adapters.sandbox.instance)."""
        with tempfile.TemporaryDirectory(prefix="harness-sbx-") as folder:
            info_path, errors = Path(folder) / "info.json", Path(folder) / "stderr"
            # setsid -f: the holder is nobody's child here (no zombie to reap, no tie to this process);
            # no pipe either, or waiting for setsid would wait for the holder to close it
            with open(info_path, "w") as info, open(errors, "w") as stderr:
                argv = [self.setsid, "-f", *self.argv(job, kept=True, info_fd=info.fileno())[:-len(runner_argv())],
                        "/usr/bin/sleep", "infinity"]
                subprocess.run(argv, pass_fds=(info.fileno(),), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=stderr, check=True, timeout=30,
                               cwd=job.workdir, env={"PATH": "/usr/bin:/bin"})
            try:
                pid = int(read_info(info_path)["child-pid"])
                wait_ready(pid)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}: {errors.read_text().strip()[-300:]}") from None
        return Holder(pid, process_start(pid))

    def run_in(self, holder: Holder, job: SandboxJob) -> SandboxOutcome:
        """Run one call inside a kept instance: nsenter into its namespaces, then the usual runner."""
        uid, gid = identity_for(job.run_id) if self.privileged else (None, None)
        if uid is not None and gid is not None:
            hand_over(job.workdir, uid, gid)
        workdir = str(job.workdir.resolve())
        user = [] if self.privileged else ["--user", "--preserve-credentials"]
        argv = [self.nsenter, f"--target={holder.pid}", *user, "--mount", "--net", "--pid", "--ipc", "--uts",
                "--root", f"--wd={workdir}", "--", *runner_argv()]
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
        return run_process(argv, job, isolation=self.isolation, env={**base, **job.env}, uid=uid, gid=gid,
                           bwrap_status=True, network_cut=not job.network, linger=False)

    def argv(self, job: SandboxJob, *, kept: bool = False, info_fd: int | None = None) -> list[str]:
        """The full bwrap command line for a job (for a kept instance: without --die-with-parent, and
        reporting its namespaces on `info_fd`)."""
        plan = MountPlan(["/", "/usr", "/proc", "/dev", "/tmp", *_SYSTEM_LINKS])
        plan.bind(Path("/usr"))
        etc = [*_ETC, *(_ETC_NETWORK if job.network else ())]
        for path in [*interpreter_paths(), *self._skill_paths(job)]:
            plan.bind(path)
        plan.bind(job.workdir.resolve(), writable=True)
        tmp_bytes = job.limits.file_mb * 1024 * 1024
        workdir = str(job.workdir.resolve())
        return [
            self.binary, *_namespaces(network=job.network, privileged=self.privileged, kept=kept), *_system_mounts(),
            "--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp",
            "--perms", "0755", "--dir", "/etc",
            *[a for name in etc for a in ("--ro-bind-try", f"/etc/{name}", f"/etc/{name}")],
            *plan.args,
            "--chdir", workdir, "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
            "--setenv", "HOME", workdir, "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp",
            *[a for name, value in sorted(job.env.items()) for a in ("--setenv", name, value)],
            *([] if info_fd is None else ["--info-fd", str(info_fd)]),
            "--", *runner_argv(),
        ]

    @staticmethod
    def _skill_paths(job: SandboxJob) -> list[Path]:
        paths = [RUNNER.parent, *(p.resolve() for p in job.code_paths)]
        if job.entry_file is not None:
            paths.append(job.entry_file.resolve().parent)
        return paths
