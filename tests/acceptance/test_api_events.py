"""Live Run state over HTTP: waits and server-sent events, also for Runs driven elsewhere (SPEC U2)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from harness.config import Runtime, build_runtime
from harness.settings import Settings
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    ORDER_STATUS,
    REFUND_L3,
    client_fixture,
    create,
    key,
    make_client,
    runtime_fixture,
)


def _events(client: TestClient, url: str, headers: dict[str, str]) -> list[tuple[str, str | None, Any]]:
    """(event, id, data) for every frame of a stream, read until the server ends it."""
    frames = []
    with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":")
        )
        if "event" in fields:
            frames.append((fields["event"], fields.get("id"), json.loads(fields["data"])))
    return frames


def test_run_stream_replays_the_path_and_ends(client: TestClient) -> None:
    """A Run's event stream gives every state change in order, with legacy status, then `end`."""
    run = create(client, ORDER_STATUS)
    frames = _events(client, f"/api/v1/runs/{run['run_id']}/events", key("alice"))
    states = [data["to"] for event, _, data in frames if event == "state"]
    assert states == run["path"]
    assert frames[-1][0] == "end"
    legacy = [data["legacy_status"] for event, _, data in frames if event == "state"]
    assert legacy[0] == "pending" and legacy[-1] == "done"


def test_stream_resumes_after_last_event_id(client: TestClient) -> None:
    """With Last-Event-ID the stream continues after that event: nothing is repeated or lost."""
    run = create(client, ORDER_STATUS)
    frames = _events(client, f"/api/v1/runs/{run['run_id']}/events", key("alice"))
    third = frames[2][1]
    assert third is not None
    rest = _events(client, f"/api/v1/runs/{run['run_id']}/events", {**key("alice"), "Last-Event-ID": third})
    assert [d["to"] for e, _, d in rest if e == "state"] == run["path"][3:]
    bad = client.get(f"/api/v1/runs/{run['run_id']}/events", headers={**key("alice"), "Last-Event-ID": "x"})
    assert bad.status_code == 422


def test_live_stream_follows_a_run_to_the_end(client: TestClient) -> None:
    """A stream opened while the Run waits for approval delivers the approval's changes live."""
    run = create(client, REFUND_L3)
    frames: list[tuple[str, str | None, Any]] = []
    reader = threading.Thread(
        target=lambda: frames.extend(_events(client, f"/api/v1/runs/{run['run_id']}/events", key("alice")))
    )
    reader.start()
    decided = client.post(
        f"/api/v1/approvals/{run['approval_request_id']}/decision",
        json={"decision": "approve", "reason": "ok"},
        headers=key("carol"),
    )
    assert decided.status_code == 200
    reader.join(20)
    assert not reader.is_alive()
    states = [d["to"] for e, _, d in frames if e == "state"]
    assert states[-3:] == ["EXECUTING", "TRACING", "SUCCEEDED"] and frames[-1][0] == "end"


def test_tenant_stream_shows_only_its_tenant(runtime: Runtime) -> None:
    """The tenant-wide stream carries the tenant's changes and none of another tenant's."""
    with make_client(runtime, stream_lifetime_s=2.0) as c:
        create(c, ORDER_STATUS, "zoe")
        mine = create(c, ORDER_STATUS, "alice")
        frames = _events(c, "/api/v1/events?after=0", key("alice"))
    runs = {d["run_id"] for e, _, d in frames if e == "state"}
    assert runs == {mine["run_id"]}


def test_runs_driven_by_another_process_are_seen(
    client: TestClient, runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Run created and driven through another Runtime on the same database shows up in waits and streams."""
    other = build_runtime(Settings(db=runtime.settings.db, data_dir=tmp_path / "other"))
    try:
        result = other.runs.create_run({"task": ORDER_STATUS, "user_id": "alice", "roles": ["support_agent"]})
    finally:
        other.close()
    doc = client.get(f"/api/v1/runs/{result.run_id}", headers=key("alice"), params={"wait": "true"}).json()
    assert doc["state"] == "SUCCEEDED"
    frames = _events(client, f"/api/v1/runs/{result.run_id}/events", key("alice"))
    assert [d["to"] for e, _, d in frames if e == "state"] == list(result.path)


def test_wait_returns_when_the_run_parks(client: TestClient) -> None:
    """`wait=true` returns once the Run waits for a human, with the request id to decide."""
    response = client.post(
        "/api/v1/runs", json={"task": REFUND_L3}, headers=key("alice"), params={"wait": "true", "timeout": 30}
    )
    doc = response.json()
    assert doc["state"] == "AWAITING_HITL" and doc["approval_request_id"]
    assert (
        client.post(
            "/api/v1/runs", json={"task": "x"}, headers=key("alice"), params={"wait": "true", "timeout": 0}
        ).status_code
        == 422
    )
