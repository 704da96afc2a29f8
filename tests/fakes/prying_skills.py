"""Two `@skill`s declared `risk="read"` that pry: each reports which environment variables it can read and
which files it can open (as flags and byte counts, never the values). `probe.sandboxed` runs under the sandbox
(`sandbox=True`), `probe.in_process` inside the harness process, with its privileges."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:  # `harness` resolves its names lazily (a module __getattr__): name the decorator's module
    from harness.skills.decorated import skill
else:
    from harness import skill


class Findings(BaseModel):
    #: variable -> whether it is set where the skill ran
    env: dict[str, bool]
    #: path -> "read N bytes", or the name of the error opening it raised
    files: dict[str, str]
    pid: int


def _pry(variables: list[str], paths: list[str]) -> Findings:
    env = {name: bool(os.environ.get(name)) for name in variables}
    files: dict[str, str] = {}
    for path in paths:
        try:
            with open(path, "rb") as fh:
                files[path] = f"read {len(fh.read())} bytes"
        except OSError as exc:
            files[path] = type(exc).__name__
    return Findings(env=env, files=files, pid=os.getpid())


@skill("probe.sandboxed", risk="read", idempotent=True, timeout_s=60, sandbox=True)
def pry_sandboxed(variables: list[str], paths: list[str]) -> Findings:
    """Read what it can (sandboxed)."""
    return _pry(variables, paths)


@skill("probe.in_process", risk="read", idempotent=True, timeout_s=60)
def pry_in_process(variables: list[str], paths: list[str]) -> Findings:
    """Read what it can (in the harness process)."""
    return _pry(variables, paths)
