"""Fixtures for the HTTP API tests: the real service app over a real SQLite runtime, driven through
Starlette's TestClient (which runs the app's lifespan, so the embedded worker really runs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.service.app import create_app
from harness.service.settings import ServiceSettings
from harness.service.telemetry import Telemetry
from harness.settings import Settings
from tests.sqlite_template import migrated_sqlite

REFUND_L2 = "Refund 42.50 EUR for order A-1001"  # self-confirm by the requester
REFUND_L3 = "Refund 180 EUR for order A-1003"  # needs a support lead
REFUND_TOO_BIG = "Refund 900 EUR for order A-1002"  # rejected by policy
ORDER_STATUS = "Where is order A-1001?"


def key(user: str) -> dict[str, str]:
    """The demo API key header of a user of the support example (docs/service.md)."""
    return {"Authorization": f"Bearer demo-{user}-key"}


def make_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock | None = None) -> Runtime:
    """A runtime over the bundled support example in a temporary folder."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    return build_runtime(Settings(db=migrated_sqlite(tmp_path / "service.db"), data_dir=tmp_path / "data"), clock=clock)


def make_client(runtime: Runtime, *, telemetry: Telemetry | None = None, **settings: Any) -> TestClient:
    """A TestClient over the service app (enter it to run the lifespan)."""
    values: dict[str, Any] = {
        "housekeeping_interval_s": 0.2,
        "poll_interval_s": 0.1,
        "stream_lifetime_s": 5.0,
        "session_secret": "test-secret-test-secret",
    }
    values.update(settings)
    return TestClient(create_app(runtime, ServiceSettings(**values), telemetry=telemetry))


@pytest.fixture(name="runtime")
def runtime_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    """The support example's runtime on the system clock."""
    rt = make_runtime(tmp_path, monkeypatch)
    yield rt
    rt.close()


@pytest.fixture(name="client")
def client_fixture(runtime: Runtime) -> Iterator[TestClient]:
    """The service, started."""
    with make_client(runtime) as c:
        yield c


def create(client: TestClient, task: str, user: str = "alice", **params: Any) -> dict[str, Any]:
    """Create a Run and wait until it is final or parked; returns the Run document."""
    response = client.post(
        "/api/v1/runs",
        json={"task": task},
        headers=key(user),
        params={"wait": "true", "timeout": 30, **params},
    )
    assert response.status_code == 202, response.text
    doc: dict[str, Any] = response.json()
    return doc
