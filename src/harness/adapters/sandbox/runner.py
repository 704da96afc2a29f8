"""The process inside the sandbox: applies the limits, drops privileges, runs one skill call.

Run as a script (``python -I runner.py``) with the job as JSON on stdin; writes one JSON result on the
stdout it was started with. Standard library only, and it imports nothing of harness: a sandboxed
call should not pay for pydantic at every process start, and the skill's own imports are its business.

Order matters: limits first, then the privilege drop, then the skill's module is imported — so no
line of skill code ever runs with more than the sandbox allows. Anything the skill prints goes to the
file the job names (`stdout_fd`, its stdout as the result reports it), or to stderr when it names none:
never to the result's own stdout, so it cannot forge the result line.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import importlib.util
import json
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

MB = 1024 * 1024
# errno of a refused operation -> the contained escape it names
_DENIED = {
    errno.EROFS: "sandbox_fs_denied", errno.EACCES: "sandbox_fs_denied",
    errno.EPERM: "sandbox_operation_denied",
    errno.ENETUNREACH: "sandbox_network_denied", errno.ENETDOWN: "sandbox_network_denied",
    errno.EAGAIN: "sandbox_process_limit", errno.EFBIG: "sandbox_file_size_limit",
}


class Context:
    """The same fields as harness.skills.manifests.SkillContext, for skills that do not import harness (a plain
    class: the dataclasses module alone would add ~10 ms to every sandboxed call's start)."""

    __slots__ = ("idempotency_key", "run_id", "step_id", "tenant_id", "user_id", "workdir")

    def __init__(self, *, run_id: str, step_id: str, idempotency_key: str, tenant_id: str, user_id: str,
                 workdir: Path) -> None:
        self.run_id = run_id
        self.step_id = step_id
        self.idempotency_key = idempotency_key
        self.tenant_id = tenant_id
        self.user_id = user_id
        self.workdir = workdir


def apply_limits(limits: dict[str, Any]) -> None:
    """Set the rlimits every process of this call inherits (memory, CPU, processes, file size)."""
    cpu = max(1, int(-(-float(limits["cpu_s"]) // 1)))  # whole seconds, rounded up
    resource.setrlimit(resource.RLIMIT_AS, (int(limits["memory_mb"]) * MB,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU first, SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_NPROC, (int(limits["processes"]),) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limits["file_mb"]) * MB,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # An oversized write then fails with EFBIG (a named error) instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def drop_privileges(uid: int | None, gid: int | None) -> None:
    """Become the call's own unprivileged user, so RLIMIT_NPROC applies (root is exempt from it)."""
    if uid is None or os.getuid() != 0:
        return
    os.setgroups([])
    os.setgid(gid if gid is not None else uid)
    os.setuid(uid)


class CodeChangedError(Exception):
    """The skill's code is not the code its Run was pinned to."""


def _pinned(source: bytes, expected: str | None, where: str) -> bytes:
    if expected is not None and hashlib.sha256(source).hexdigest() != expected:
        raise CodeChangedError(f"{where} changed since the skill was loaded; the pinned version is not there")
    return source


def load_function(job: dict[str, Any]) -> Any:
    """The skill's function, from a file (executed from exactly the bytes checked against the pinned
    hash) or an importable module (whose source is checked first). A code skill's module root and the
    harness package come first on sys.path (`python_path`): the same code as the process that sent the job."""
    sys.path[:0] = [p for p in job.get("python_path") or () if p not in sys.path]
    expected = job.get("entry_sha256")
    if job.get("entry_file"):
        path = Path(job["entry_file"])
        source = _pinned(path.read_bytes(), expected, path.name)
        spec = importlib.util.spec_from_file_location(f"sandboxed_{path.stem}", path)
        if spec is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        exec(compile(source, str(path), "exec"), module.__dict__)  # the pinned bytes, not a re-read
    else:
        if expected is not None:
            found = importlib.util.find_spec(job["entry_module"])
            origin = found.origin if found is not None else None
            _pinned(Path(origin).read_bytes() if origin and os.path.isfile(origin) else b"", expected,
                    job["entry_module"])
        module = importlib.import_module(job["entry_module"])
    return getattr(module, job["function"])


def make_context(raw: dict[str, str]) -> Any:
    """A SkillContext when the skill imported harness anyway, the look-alike otherwise."""
    skills = sys.modules.get("harness.skills.manifests")
    cls: Any = getattr(skills, "SkillContext", Context) if skills is not None else Context
    return cls(**{**raw, "workdir": Path(raw["workdir"])})


def classify(exc: BaseException, network_cut: bool) -> tuple[str, bool]:
    """(error code, retryable) for an exception the skill raised. When the sandbox cut the network, any
    failure to reach or resolve a host is the sandbox's doing (its loopback is its own), not transient."""
    if isinstance(exc, MemoryError):
        return "sandbox_memory_limit", False
    if isinstance(exc, CodeChangedError):
        return "manifest_changed", False
    if network_cut and (type(exc).__name__ == "gaierror" or isinstance(exc, ConnectionError)):
        return "sandbox_network_denied", False
    if isinstance(exc, OSError) and exc.errno in _DENIED:
        return _DENIED[exc.errno], False
    retryable = type(exc).__name__ == "RetryableSkillError" or isinstance(exc, ConnectionError | TimeoutError)
    return type(exc).__name__, retryable


def _failure(code: str, retryable: bool, message: str) -> str:
    return json.dumps({"ok": False, "code": code, "retryable": retryable, "message": message[:2_000]})


def main() -> int:
    """Read the job, run it, write the result; the exit code is 0 whenever a result was written."""
    job = json.loads(sys.stdin.read())
    origin = os.getpid()
    result_fd = os.dup(1)
    printed = job.get("stdout_fd")
    os.dup2(printed if isinstance(printed, int) else 2, 1)  # the skill's prints (and its children's)
    apply_limits(job["limits"])
    drop_privileges(job.get("uid"), job.get("gid"))
    try:
        fn = load_function(job)
        # a @skill function (harness.skills.decorated) validates its arguments and dumps its output as in process
        call = getattr(fn, "__harness_call__", fn)
        output = call(job["arguments"], make_context(job["context"]))
    except BaseException as exc:  # the skill's failure is reported, never raised past this point
        if os.getpid() != origin:
            os._exit(1)  # a forked child of the skill unwinding here must not write a second result
        line = _failure(*classify(exc, bool(job.get("network_cut"))), f"{type(exc).__name__}: {exc}")
    else:
        if os.getpid() != origin:
            os._exit(0)
        try:
            line = json.dumps({"ok": True, "output": output})
        except (TypeError, ValueError) as exc:
            line = _failure("invalid_output", False, f"the skill's result is not JSON: {exc}")
    with os.fdopen(result_fd, "w", encoding="utf-8") as out:
        out.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
