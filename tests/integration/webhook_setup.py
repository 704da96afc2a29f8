"""A runtime whose Runs push webhooks to loopback receivers: the webhooks file, secrets and settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.settings import Settings
from tests.conftest import FIXTURES
from tests.fakes.webhook_receiver import SECRET

APPROVER_SECRET = "whsec_" + "YXBwcm92ZXItc2VjcmV0LWZvci10ZXN0cy0wMDAwMDA="


def write_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, approver_url: str = "http://127.0.0.1:9/a",
                 internal: tuple[str, ...] = ("127.0.0.1",), **delivery: Any) -> Path:
    """A webhooks file: t1's callbacks signed with SECRET, t1's leads told at `approver_url`; t1 opted in
    to the `internal` receivers (the loopback receivers of these tests)."""
    monkeypatch.setenv("TEST_CALLER_SECRET", SECRET)
    monkeypatch.setenv("TEST_APPROVER_SECRET", APPROVER_SECRET)
    path = tmp_path / "webhooks.yaml"
    config: dict[str, Any] = {
        "console_url": "http://127.0.0.1:8000",
        "callback_secrets": {"t1": {"secret_env": "TEST_CALLER_SECRET"}},
        **({"internal_callbacks": {"t1": list(internal)}} if internal else {}),
        "approvers": [{"name": "t1-leads", "tenant": "t1", "role": "lead", "url": approver_url,
                       "secret_env": "TEST_APPROVER_SECRET"}],
        "delivery": {"max_attempts": 4, "backoff_s": 10, "max_backoff_s": 100, "timeout_s": 1.0, "lease_s": 5,
                     **delivery},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def webhook_runtime(db: str, tmp_path: Path, config: Path | None, clock: FakeClock | None = None) -> Runtime:
    """A runtime over the test skills and policy that pushes per `config`."""
    settings = Settings(db=db, skills_dirs=(FIXTURES / "skills",), policy_file=FIXTURES / "policy.yaml",
                        llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                        data_dir=tmp_path / "data", webhooks_file=config)
    return build_runtime(settings, clock=clock)
