"""Idempotency keys over HTTP and the CLI (SPEC K5, G4): scoped per (tenant, user), bound to the body."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from harness.config import Runtime
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    ORDER_STATUS,
    REFUND_L3,
    client_fixture,
    key,
    runtime_fixture,
)


def test_another_user_reusing_a_key_gets_a_run_of_their_own(client: TestClient, runtime: Runtime) -> None:
    """bob sending alice's key creates bob's Run: he never receives her Run or her task."""
    mine = client.post("/api/v1/runs", json={"task": REFUND_L3, "idempotency_key": "k-42"}, headers=key("alice"))
    theirs = client.post("/api/v1/runs", json={"task": ORDER_STATUS, "idempotency_key": "k-42"},
                         headers=key("bob"))
    assert (mine.status_code, theirs.status_code) == (202, 202)
    assert theirs.json()["run_id"] != mine.json()["run_id"]
    assert (theirs.json()["user_id"], theirs.json()["task"]) == ("bob", ORDER_STATUS)
    again = client.post("/api/v1/runs", json={"task": ORDER_STATUS, "idempotency_key": "k-42"}, headers=key("bob"))
    assert again.status_code == 200 and again.json()["run_id"] == theirs.json()["run_id"]


def test_the_same_key_with_another_body_is_a_409(client: TestClient, runtime: Runtime) -> None:
    """A key reused with a different request is a conflict naming the key's Run; nothing is created, and
    the original request still gets its Run back."""
    first = client.post("/api/v1/runs", json={"task": ORDER_STATUS, "idempotency_key": "k-7"}, headers=key("alice"))
    assert first.status_code == 202
    for other in ({"task": REFUND_L3}, {"task": ORDER_STATUS, "metadata": {"ticket": "T-1"}},
                  {"task": ORDER_STATUS, "session_id": "s2"}):
        conflict = client.post("/api/v1/runs", json={**other, "idempotency_key": "k-7"}, headers=key("alice"))
        assert conflict.status_code == 409, conflict.text
        doc = conflict.json()
        assert doc["error"] == "idempotency_conflict" and doc["run_id"] == first.json()["run_id"]
        assert "k-7" in doc["detail"]
    same = client.post("/api/v1/runs", json={"task": ORDER_STATUS, "idempotency_key": "k-7"}, headers=key("alice"))
    assert same.status_code == 200 and same.json()["run_id"] == first.json()["run_id"]
    assert len(runtime.store.list_runs()) == 1


def test_the_cli_refuses_a_reused_key_with_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`harness run` with a key already used for another task exits 2 (bad input) naming the Run; the same
    task with the same key returns the same Run (exit 0)."""
    from harness.cli import app

    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path / "data"))
    db = str(tmp_path / "cli.db")
    runner = CliRunner()
    first = runner.invoke(app, ["run", ORDER_STATUS, "--idempotency-key", "k-1", "--db", db, "--json"])
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, ["run", ORDER_STATUS, "--idempotency-key", "k-1", "--db", db, "--json"])
    assert again.exit_code == 0 and '"run_id"' in again.stdout
    assert again.stdout.split('"run_id": ')[1][:30] == first.stdout.split('"run_id": ')[1][:30]
    other = runner.invoke(app, ["run", REFUND_L3, "--idempotency-key", "k-1", "--db", db, "--json"])
    assert other.exit_code == 2 and other.stdout == ""
    assert "idempotency key 'k-1' was already used for run" in other.stderr
    assert "Traceback" not in other.output
