"""A sandboxed call as JSON, both ways: what the remote provider's client sends and its server reads.

The job names its paths (working directory, skill code, interpreter paths) as the harness host sees them;
the server runs the call at those same paths, so they must be the same on both hosts (a shared volume).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from harness.domain.sandbox import Holder, Limits, SandboxJob, SandboxOutcome


def job_to_json(job: SandboxJob) -> dict[str, Any]:
    """The job as plain JSON."""
    return {
        "skill_id": job.skill_id, "function": job.function, "arguments": job.arguments, "context": job.context,
        "workdir": str(job.workdir), "wall_s": job.wall_s, "limits": job.limits.model_dump(),
        "network": job.network, "entry_file": str(job.entry_file) if job.entry_file else None,
        "entry_module": job.entry_module, "entry_sha256": job.entry_sha256, "env": job.env,
        "python_path": [str(p) for p in job.python_path], "code_paths": [str(p) for p in job.code_paths],
        "stream_bytes": job.stream_bytes,
    }


def job_from_json(data: dict[str, Any]) -> SandboxJob:
    """The job a client sent; raises ValueError (or a pydantic error) when it is not one."""
    try:
        return SandboxJob(
            skill_id=str(data["skill_id"]), function=str(data["function"]), arguments=dict(data["arguments"]),
            context={str(k): str(v) for k, v in dict(data["context"]).items()}, workdir=Path(data["workdir"]),
            wall_s=float(data["wall_s"]), limits=Limits(**data.get("limits") or {}),
            network=bool(data.get("network")),
            entry_file=Path(data["entry_file"]) if data.get("entry_file") else None,
            entry_module=data.get("entry_module"), entry_sha256=data.get("entry_sha256"),
            env={str(k): str(v) for k, v in dict(data.get("env") or {}).items()},
            python_path=tuple(Path(p) for p in data.get("python_path") or ()),
            code_paths=tuple(Path(p) for p in data.get("code_paths") or ()),
            stream_bytes=int(data.get("stream_bytes", 16_384)),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a sandbox job: {exc!r}") from None


def outcome_to_json(outcome: SandboxOutcome) -> dict[str, Any]:
    """The outcome as plain JSON."""
    return dataclasses.asdict(outcome)


def outcome_from_json(data: dict[str, Any]) -> SandboxOutcome:
    """The outcome a server sent."""
    names = {f.name for f in dataclasses.fields(SandboxOutcome)}
    return SandboxOutcome(**{k: v for k, v in data.items() if k in names})


def holder_to_json(holder: Holder) -> dict[str, int | None]:
    """An instance's process as plain JSON."""
    return {"pid": holder.pid, "pid_start": holder.pid_start}


def holder_from_json(data: dict[str, Any]) -> Holder:
    """An instance's process a peer sent."""
    pid, start = data.get("pid"), data.get("pid_start")
    return Holder(int(pid) if pid is not None else None, int(start) if start is not None else None)
