"""harness-kernel: executes AI-agent Runs as governed, auditable, recoverable units of work.

The library API (docs/guide-your-own-agent.md)::

    from harness import Harness
    with Harness(db="harness.db") as h:
        result = h.run("Where is order A-1001?", user="alice")

`Harness` (and `AsyncHarness`) sit on the composition root (`build_runtime`), as the CLI and the
service do; an `Agent` names the instructions, model, skills (YAML manifests or `@skill` functions)
and policy.

Names are imported lazily, so that `harness.audit.standalone` (the auditor's verifier) can be used
without loading any database code.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Agent": "harness.agents",
    "support_agent": "harness.agents",
    "ApprovalRequest": "harness.api",
    "AsyncHarness": "harness.api",
    "DecisionOutcome": "harness.api",
    "Harness": "harness.api",
    "RunEvent": "harness.api",
    "TraceEntry": "harness.api",
    "CodeSkill": "harness.skills.decorated",
    "skill": "harness.skills.decorated",
    "SkillContext": "harness.skills.manifests",
    "Runtime": "harness.config",
    "Settings": "harness.settings",
    "build_runtime": "harness.config",
    "BacklogFullError": "harness.domain.errors",
    "BadInputError": "harness.domain.errors",
    "HarnessError": "harness.domain.errors",
    "InvalidRequestError": "harness.domain.errors",
    "InvalidTransitionError": "harness.domain.errors",
    "UnknownRunError": "harness.domain.errors",
    "CloseReason": "harness.kernel.states",
    "JobStatus": "harness.kernel.projection",
    "RunState": "harness.kernel.states",
    "CallerIdentity": "harness.domain.contracts",
    "RunRequest": "harness.domain.contracts",
    "RunResult": "harness.domain.contracts",
}

__all__ = [  # spelled out for static tools; tests/unit/test_public_api.py keeps it equal to _EXPORTS
    "Agent",
    "ApprovalRequest",
    "AsyncHarness",
    "BacklogFullError",
    "BadInputError",
    "CallerIdentity",
    "CloseReason",
    "CodeSkill",
    "DecisionOutcome",
    "Harness",
    "HarnessError",
    "InvalidRequestError",
    "InvalidTransitionError",
    "JobStatus",
    "RunEvent",
    "RunRequest",
    "RunResult",
    "RunState",
    "Runtime",
    "Settings",
    "SkillContext",
    "TraceEntry",
    "UnknownRunError",
    "__version__",
    "build_runtime",
    "skill",
    "support_agent",
]


def __getattr__(name: str) -> Any:
    """Import the public names on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
