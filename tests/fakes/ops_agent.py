"""An agent defined in Python, for the tests that serve, drive and approve it from other processes: `ops`
restarts a service (an L3 write a support lead approves), its skill a `@skill` function. Reference it as
`tests.fakes.ops_agent:ops` (the repository's root on PYTHONPATH or the working directory).

`ops_changed` is the same agent after a change of its skill (another timeout: another manifest hash), as a
deployment that changed the code while a Run waited would load it. Every call of the skill is appended to
the file HARNESS_TEST_CALL_LOG names, the side effect the tests count."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from harness import Agent, CodeSkill, SkillContext
from harness.examples.support import EXAMPLE_DIR

if TYPE_CHECKING:  # `harness` resolves its names lazily (a module __getattr__): name the decorator's module
    from harness.skills.decorated import skill
else:
    from harness import skill

HERE = Path(__file__).resolve().parent / "ops"
TASK = "restart the billing service"


class Restarted(BaseModel):
    service: str
    key: str


def _log(service: str, ctx: SkillContext) -> Restarted:
    with open(os.environ["HARNESS_TEST_CALL_LOG"], "a") as log:
        log.write(json.dumps({"skill": "ops.restart", "service": service, "key": ctx.idempotency_key}) + "\n")
    return Restarted(service=service, key=ctx.idempotency_key)


@skill("ops.restart", risk="write", space="personal", impact="high", timeout_s=10)
def restart(service: str, ctx: SkillContext) -> Restarted:
    """Restart a service."""
    return _log(service, ctx)


@skill("ops.restart", risk="write", space="personal", impact="high", timeout_s=20)
def restart_changed(service: str, ctx: SkillContext) -> Restarted:
    """Restart a service (a later version: a longer timeout)."""
    return _log(service, ctx)


def _agent(restart_skill: CodeSkill) -> Agent:
    return Agent(name="ops", instructions="You are the operations agent: you restart services when asked.",
                 skills=(restart_skill,), policy=HERE / "policy.yaml",
                 identities=EXAMPLE_DIR / "identities.yaml",  # the support example's people: carol leads
                 llm_rules=HERE / "rules.yaml")


ops = _agent(restart)
ops_changed = _agent(restart_changed)
not_an_agent = "ops"
