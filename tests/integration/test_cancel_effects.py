"""A cancel that lands while a call with side effects is running tells what had started: its answer
(library, API, CLI) and its `run.finished` push list the calls that completed or were in flight when it
took effect, and nothing starts after it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.config import Runtime
from harness.drive.worker import RunWorker
from harness.operations import Operations
from harness.service.views import run_document
from tests.fakes.webhook_receiver import WebhookReceiver

from .webhook_setup import webhook_runtime, write_config

TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


def calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _wait_for_b(log: Path) -> None:
    deadline = time.monotonic() + 30
    while not any(c.get("step") == "b" and c.get("phase") == "start" for c in calls(log)):
        assert time.monotonic() < deadline, "the drive never reached step b"
        time.sleep(0.02)


@pytest.fixture
def rt(backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call_log: Path) -> Iterator[Runtime]:
    """A pushing runtime over the test skills on the backend under test, on the system clock."""
    runtime = webhook_runtime(backend_url, tmp_path, write_config(tmp_path, monkeypatch))
    yield runtime
    runtime.close()


def test_a_cancel_during_a_call_lists_what_had_started(rt: Runtime, call_log: Path, tmp_path: Path) -> None:
    """Cancelled while step b (not idempotent) runs: the answer is CLOSED_CANCELLED listing a completed and
    b in flight; b finishes, c never starts; the Run read back, the CLI and the push list the same calls."""
    assert rt.webhook_outbox is not None
    with WebhookReceiver() as receiver:
        run, _ = rt.runs.submit({"task": "hang 1.5", **TESS, "callback": receiver.url})
        driver = threading.Thread(target=RunWorker(rt, owner="w1").execute, args=(run.run_id,))
        driver.start()
        _wait_for_b(call_log)
        answer = rt.runs.cancel(run.run_id, by="t1/op")
        driver.join(30)
        assert answer.state == "CLOSED_CANCELLED"
        assert [(e["step_id"], e["skill"], e["status"]) for e in answer.effects] == [
            ("a", "test.echo", "completed"), ("b", "test.hang", "in_flight")]
        log = calls(call_log)
        assert [c["step"] for c in log if c["skill"] == "test.echo"] == ["a"]  # c never started
        assert [c["phase"] for c in log if c["skill"] == "test.hang"] == ["start", "end"]  # b was let finish
        shown = CliRunner().invoke(app, ["runs", "show", run.run_id, "--db", str(rt.settings.db), "--json"],
                                   env={"HARNESS_WEBHOOKS_FILE": str(tmp_path / "webhooks.yaml")})
        assert shown.exit_code == 0, shown.output
        assert [(e["step_id"], e["status"]) for e in json.loads(shown.stdout)["effects"]] == [
            ("a", "completed"), ("b", "completed")]
        api = run_document(Operations(rt), rt.store.get_run(run.run_id))  # what GET and POST .../cancel answer
        assert [(e["step_id"], e["status"]) for e in api.effects] == [("a", "completed"), ("b", "completed")]
        finished = [d.data() for d in rt.webhook_outbox.list(run_id=run.run_id) if d.event_type == "run.finished"]
        assert len(finished) == 1
        data = finished[0]["data"]
        assert isinstance(data, dict) and data["state"] == "CLOSED_CANCELLED"
        assert [(e["step_id"], e["status"]) for e in data["effects"]] == [("a", "completed"), ("b", "in_flight")]


def test_a_run_cancelled_before_any_call_lists_none(rt: Runtime) -> None:
    """A Run cancelled while it waits for approval had started nothing: its answer lists no effects."""
    parked = rt.runs.create_run({"task": "purge cache", **TESS})
    assert parked.state == "AWAITING_HITL"
    answer = rt.runs.cancel(parked.run_id, by="t1/op")
    assert answer.state == "CLOSED_CANCELLED" and answer.effects == ()
