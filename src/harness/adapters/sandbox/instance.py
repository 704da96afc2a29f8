"""Kept sandbox instances: a process that holds a Run's namespaces between calls of one skill.

Under bubblewrap an instance is a long-lived bwrap whose namespaces (mount, network, PID, IPC, UTS) are
held by a process that only sleeps; each call of the skill enters them with nsenter and runs the usual
runner there. So a service a call starts (in a session of its own) is still there for the next call, and
its network is the instance's own: loopback inside, nothing of the host's. The holder is started in a
new session and is not tied to the process that started it — a Run waiting for a human, or a harness
process that restarts, keeps it. Killing the holder (PID 1 of the instance's PID namespace) ends every
process of the instance at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from harness.domain.sandbox import Holder

#: how long a new holder may take to report its namespaces
START_TIMEOUT_S = 10.0
#: how long a killed holder may take to be gone
STOP_TIMEOUT_S = 5.0


def process_start(pid: int) -> int | None:
    """The start time (clock ticks since boot) of a running process; None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def alive(holder: Holder) -> bool:
    """Whether the instance's process still runs (an instance without a process is always alive)."""
    if holder.pid is None:
        return True
    return process_start(holder.pid) == holder.pid_start


def stop(holder: Holder) -> bool:
    """Kill the instance's process and wait until it is gone; True when it is gone."""
    if holder.pid is None or not alive(holder):
        return True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(holder.pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    pause = 0.001
    while alive(holder):
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


def read_info(path: Path, timeout_s: float = START_TIMEOUT_S) -> dict[str, int]:
    """bwrap's --info-fd report (its child pid and namespace ids), once it is complete."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(path.read_text())
            if isinstance(info, dict) and "child-pid" in info:
                return info
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sandbox instance did not report its namespaces within {timeout_s:.3g}s")
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def wait_ready(pid: int, command: str = "sleep", timeout_s: float = START_TIMEOUT_S) -> None:
    """Wait until the instance's first process has started its command: bwrap reports the pid as soon
    as it exists, before its mounts are made; the command runs only once they are all in place."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        with contextlib.suppress(OSError):
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                if Path(f"/proc/{child}/comm").read_text().strip() == command:
                    return
        if process_start(pid) is None:
            raise RuntimeError("the sandbox instance ended while it started")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the sandbox instance was not ready within {timeout_s:.3g}s")
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


class HolderProcesses:
    """The processes of this host's kept instances (ports.sandboxes.InstanceProcesses): /proc and signals."""

    def alive(self, holder: Holder) -> bool:
        return alive(holder)

    def stop(self, holder: Holder) -> bool:
        return stop(holder)
