"""Starting, bounding and reading one sandboxed call's process; shared by both isolation levels.

The job goes in through a file on stdin and the result comes back through a file on stdout; what the skill
prints goes to a third file, handed to the runner as an open descriptor (no pipes, so no call can deadlock
on a full buffer, and RLIMIT_FSIZE also bounds what the skill can print).
The process leads its own process group; when the call ends — normally, by its wall-time limit, or
by crashing — the whole group is killed, so nothing the skill started outlives the call.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from harness.domain.sandbox import SandboxJob, SandboxOutcome

RUNNER = Path(__file__).resolve().with_name("runner.py")
STDERR_TAIL = 2_000
#: how long a finished call waits for the last processes of its sandbox to be gone
LINGER_S = 2.0

_log = logging.getLogger("harness.sandbox")


@dataclass(frozen=True)
class Exit:
    """How the process ended: status, terminating signal, CPU seconds used, and whether we killed it."""

    status: int
    signal: int | None
    cpu_s: float
    timed_out: bool


def runner_argv() -> list[str]:
    """The interpreter running the runner script, isolated from PYTHON* variables and the cwd."""
    return [sys.executable, "-I", str(RUNNER)]


def payload(job: SandboxJob, uid: int | None = None, gid: int | None = None,
            network_cut: bool = False, stdout_fd: int | None = None) -> bytes:
    """The runner's stdin; `network_cut` tells the runner a failed connection is the sandbox's doing,
    `stdout_fd` where the skill's prints go (None: to stderr)."""
    return json.dumps({
        "entry_file": str(job.entry_file) if job.entry_file else None, "entry_module": job.entry_module,
        "entry_sha256": job.entry_sha256, "python_path": [str(p) for p in job.python_path],
        "function": job.function, "arguments": job.arguments, "context": job.context,
        "limits": job.limits.model_dump(), "network_cut": network_cut, "uid": uid, "gid": gid,
        "stdout_fd": stdout_fd,
    }).encode()


def run_process(argv: Sequence[str], job: SandboxJob, *, isolation: str, env: dict[str, str],
                uid: int | None = None, gid: int | None = None, bwrap_status: bool = False,
                network_cut: bool = False, linger: bool = True) -> SandboxOutcome:
    """Run the call's process to its end or its wall-time limit and describe what happened. `linger`
    waits, after a failed call, for every process of its uid to be gone; a call into a kept instance
    does not, since the services the skill started there are meant to stay."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, \
            tempfile.TemporaryFile() as stderr, tempfile.TemporaryFile() as printed:
        stdin.write(payload(job, uid, gid, network_cut, printed.fileno()))
        stdin.seek(0)
        proc = subprocess.Popen(list(argv), stdin=stdin, stdout=stdout, stderr=stderr, cwd=job.workdir,
                                env=env, start_new_session=True, close_fds=True, pass_fds=(printed.fileno(),))
        ended = _wait(proc, job.wall_s)
        raw = _read(stdout, job.limits.output_kb * 1024 + 1)
        streams = {"stdout": clip(printed, job.stream_bytes), "stderr": clip(stderr, job.stream_bytes)}
        tail = clip(stderr, STDERR_TAIL, head=False)
    duration = round((time.perf_counter() - started) * 1000, 3)
    outcome = interpret(job, ended, raw, bwrap_status=bwrap_status)
    if linger and uid is not None and not outcome.get("ok"):
        _wait_until_gone(uid)  # a call that failed (a limit, a kill, a crash) may have left a crowd behind
    return SandboxOutcome(**{**outcome, **streams, "isolation": isolation, "stderr_tail": tail,
                             "duration_ms": duration})


def _wait(proc: subprocess.Popen[bytes], wall_s: float) -> Exit:
    # A pidfd wakes us the moment the process exits (Popen.wait(timeout) polls up to 50 ms late),
    # and wait4 gives the CPU time that tells a CPU-limit kill from any other SIGKILL.
    fd = os.pidfd_open(proc.pid)
    try:
        timed_out = not select.select([fd], [], [], max(wall_s, 0.0))[0]
    finally:
        os.close(fd)
    kill_group(proc.pid)  # stragglers the skill left behind, and on timeout the call itself
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    return Exit(proc.returncode, sig, usage.ru_utime + usage.ru_stime, timed_out)


def _wait_until_gone(uid: int, limit_s: float = LINGER_S) -> None:
    """Return once no process of the call's own uid is left. Processes the skill started in a new session
    escape the group kill; the kernel kills them when the sandbox's PID namespace ends, but that finishes
    shortly after the sandbox process itself is reaped. A call is over only when they are gone."""
    deadline = time.monotonic() + limit_s
    pause = 0.001
    while _processes_of(uid):
        if time.monotonic() > deadline:
            _log.warning("processes of sandbox uid %d still exist %.1fs after the call ended", uid, limit_s)
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _processes_of(uid: int) -> bool:
    """Whether any process (zombies included, until reaped) has `uid` as its real uid."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/status", "rb") as status:
                    for line in status:
                        if line.startswith(b"Uid:"):
                            if int(line.split()[1]) == uid:
                                return True
                            break
            except OSError:  # the process ended while we looked
                continue
    return False


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; it may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _read(fh: IO[bytes], limit: int | None) -> bytes:
    fh.seek(0)
    return fh.read() if limit is None else fh.read(limit)


def clip(fh: IO[bytes], limit: int, *, head: bool = True) -> str:
    """What a stream file holds, as text, within `limit` bytes: all of it when it fits; otherwise its start
    and its end (or only its end, without `head`) around a line saying how many bytes were left out. Only
    what is kept is read: a skill that printed its whole file-size limit costs no more than one that did not."""
    size = fh.seek(0, os.SEEK_END)
    if size <= limit:
        return _read(fh, None).decode("utf-8", "replace")
    first = limit // 2 if head else 0
    fh.seek(0)
    start = fh.read(first)
    fh.seek(size - (limit - first))
    end = fh.read(limit - first)
    left_out = size - len(start) - len(end)
    return (f"{start.decode('utf-8', 'replace')}\n[… {left_out} bytes left out …]\n"
            f"{end.decode('utf-8', 'replace')}")

def interpret(job: SandboxJob, ended: Exit, raw: bytes, *, bwrap_status: bool) -> dict[str, Any]:
    """The outcome's fields from the exit and the result line."""
    if ended.timed_out:
        return {"ok": False, "error_code": "timeout", "exit_status": ended.status,
                "message": f"{job.skill_id} ran longer than {job.wall_s:.3g}s; its processes were killed"}
    if len(raw) > job.limits.output_kb * 1024:
        return {"ok": False, "error_code": "sandbox_output_too_large", "exit_status": ended.status,
                "message": f"{job.skill_id}'s result is larger than {job.limits.output_kb} KiB"}
    result = _parse(raw)
    if result is not None and result.get("ok") is True:
        return {"ok": True, "output": result.get("output"), "exit_status": ended.status}
    if result is not None:
        return {"ok": False, "error_code": str(result.get("code", "skill_error")),
                "exit_status": ended.status, "message": str(result.get("message", "")),
                "retryable": bool(result.get("retryable"))}
    sig = ended.signal
    if sig is None and bwrap_status and ended.status > 128:
        sig = ended.status - 128  # bwrap reports a child killed by a signal as 128 + signal
    return {"ok": False, "exit_status": ended.status, **_death(job, sig, ended)}


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _death(job: SandboxJob, sig: int | None, ended: Exit) -> dict[str, str]:
    """Name a death without a result line."""
    name = signal.Signals(sig).name if sig is not None and sig in signal.valid_signals() else None
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and ended.cpu_s >= job.limits.cpu_s):
        return {"error_code": "sandbox_cpu_limit",
                "message": f"{job.skill_id} used its {job.limits.cpu_s:.3g}s of CPU and was killed"}
    if sig == signal.SIGXFSZ:
        return {"error_code": "sandbox_file_size_limit",
                "message": f"{job.skill_id} wrote past its {job.limits.file_mb} MiB file-size limit"}
    if sig is not None:
        return {"error_code": "sandbox_crashed",
                "message": f"{job.skill_id}'s process was killed by {name or sig}"}
    return {"error_code": "sandbox_crashed",
            "message": f"{job.skill_id}'s process exited with status {ended.status} without a result"}
