"""harness-kernel: executes AI-agent Runs as governed, auditable, recoverable units of work.

The library API: build a Runtime from Settings and drive Runs through its RunManager::

    from harness import Settings, build_runtime
    rt = build_runtime(Settings(db="harness.db"))
    result = rt.runs.create_run({"task": "Where is order A-1001?", "user_id": "alice"})

Names are imported lazily, so that `harness.audit.standalone` (the auditor's verifier) can be used
without loading any database code.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Runtime": "harness.config",
    "Settings": "harness.config",
    "build_runtime": "harness.config",
    "BadInputError": "harness.errors",
    "HarnessError": "harness.errors",
    "InvalidRequestError": "harness.errors",
    "InvalidTransitionError": "harness.errors",
    "UnknownRunError": "harness.errors",
    "CloseReason": "harness.kernel",
    "JobStatus": "harness.kernel",
    "RunState": "harness.kernel",
    "CallerIdentity": "harness.pipeline.contracts",
    "RunRequest": "harness.pipeline.contracts",
    "RunResult": "harness.pipeline.contracts",
}

__all__ = [  # spelled out for static tools; tests/unit/test_public_api.py keeps it equal to _EXPORTS
    "BadInputError",
    "CallerIdentity",
    "CloseReason",
    "HarnessError",
    "InvalidRequestError",
    "InvalidTransitionError",
    "JobStatus",
    "RunRequest",
    "RunResult",
    "RunState",
    "Runtime",
    "Settings",
    "UnknownRunError",
    "__version__",
    "build_runtime",
]


def __getattr__(name: str) -> Any:
    """Import the public names on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
