"""The support example's sandboxed skill: one shell command, run inside the sandbox.

It imports nothing of harness at run time: every sandboxed call starts a fresh interpreter, and the
context it receives has the same fields as harness.skills.manifests.SkillContext.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.skills.manifests import SkillContext

MAX_CHARS = 64_000


def run_command(args: dict[str, Any], ctx: SkillContext) -> dict[str, Any]:
    """Run `command` with /bin/sh in the Run's working directory; its exit code and (tail of) output."""
    done = subprocess.run(["/bin/sh", "-c", args["command"]], capture_output=True, text=True,
                          cwd=ctx.workdir, check=False)
    return {"exit_code": done.returncode, "stdout": done.stdout[-MAX_CHARS:],
            "stderr": done.stderr[-MAX_CHARS:]}
